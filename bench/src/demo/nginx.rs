//! The peer a user would build instead: nginx serving the files next to the data, and
//! nginx `proxy_cache` next to the GPUs, with 1 MiB slices (`ngx_http_slice_module`, the
//! documented way to cache range requests; shardcache's chunk is also 1 MiB) and
//! `proxy_cache_lock` (one upstream fetch per slice, like shardcache's coalescing).

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context, bail};

/// The nginx binary, if installed with the slice module; otherwise why not.
pub fn find() -> Result<PathBuf, String> {
    let path = ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("nginx is not installed (scripts/demo.sh installs it with apt-get when it can)")?;
    let version = Command::new(&path).arg("-V").output().map_err(|e| format!("{}: {e}", path.display()))?;
    if !String::from_utf8_lossy(&version.stderr).contains("http_slice_module") {
        return Err(format!("{} lacks http_slice_module, needed to cache range requests", path.display()));
    }
    Ok(path)
}

/// A free port on 127.0.0.1 (bound, then released for nginx to take).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A running nginx; stopped when dropped.
#[derive(Debug)]
pub struct Nginx {
    child: Child,
    pub port: u16,
}

impl Nginx {
    /// Starts `binary` with the `http { ... }` block `http`, listening on `port`, with all
    /// its files under `dir`.
    pub fn start(binary: &Path, dir: &Path, port: u16, http: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("tmp"))?;
        // As root, nginx's workers would run as `nobody` and not read our temp files.
        let user = if is_root() { "user root;" } else { "" };
        let tmp = dir.join("tmp");
        let tmp = tmp.display();
        let conf = format!(
            "{user}
worker_processes 2;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
{http}
}}
",
            dir = dir.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = Command::new(binary)
            .arg("-p")
            .arg(dir)
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let mut nginx = Self { child, port };
        // Up to 10 s for it to listen.
        for _ in 0..100 {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(nginx);
            }
            if let Some(status) = nginx.child.try_wait()? {
                bail!("nginx exited ({status}); see {}/error.log", dir.display());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("nginx did not listen on 127.0.0.1:{port} within 10 s")
    }

    /// nginx serving the files of `root` (the hub side).
    pub fn origin(binary: &Path, dir: &Path, root: &Path) -> anyhow::Result<Self> {
        let port = free_port()?;
        let http = format!(
            "    sendfile on;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}",
            root = root.display()
        );
        Self::start(binary, dir, port, &http)
    }

    /// nginx caching `upstream` (the spoke side) in `dir/cache`, 1 MiB slices.
    pub fn cache(binary: &Path, dir: &Path, upstream_port: u16) -> anyhow::Result<Self> {
        let port = free_port()?;
        let http = format!(
            "    proxy_cache_path {dir}/cache levels=1:2 keys_zone=shards:64m max_size=8g inactive=1d use_temp_path=off;
    upstream origin {{
        server 127.0.0.1:{upstream_port};
        keepalive 64;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            slice 1m;
            proxy_cache shards;
            proxy_cache_key $uri$slice_range;
            proxy_set_header Range $slice_range;
            proxy_cache_valid 200 206 1d;
            proxy_cache_lock on;
            proxy_cache_lock_timeout 60s;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            add_header X-Cache-Status $upstream_cache_status always;
            proxy_pass http://origin;
        }}
    }}",
            dir = dir.display()
        );
        Self::start(binary, dir, port, &http)
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Nginx {
    /// SIGTERM, not SIGKILL: the master then stops its workers (a killed master leaves
    /// them holding the port).
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
