//! S3 for the benches: clients of the spoke's S3 door and of the peer, versitygw (an S3
//! gateway serving a folder's subfolders as buckets from its local-disk backend:
//! `go install github.com/versity/versitygw/cmd/versitygw@v1.8.0`, as `make load` does).

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use aws_sdk_s3::Client;
use hub_server::source::s3::{S3Options, client as s3_client};

/// The access key pair versitygw is started with.
pub const VERSITYGW_KEY: (&str, &str) = ("benchkey", "benchsecret");

/// An S3 client of `endpoint` signing with `key`: path style, us-east-1 (the door's and
/// versitygw's defaults).
pub async fn client(endpoint: String, key: (&str, &str)) -> Client {
    s3_client(&S3Options {
        endpoint: Some(endpoint),
        region: Some("us-east-1".into()),
        path_style: true,
        static_credentials: Some((key.0.into(), key.1.into())),
    })
    .await
}

/// versitygw serving a folder's subfolders as buckets, killed when dropped.
#[derive(Debug)]
pub struct Versitygw {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    pub endpoint: String,
}

impl Drop for Versitygw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// versitygw serving `root`, when it is installed (`None`, said on stderr, when not).
pub fn versitygw(root: &Path) -> Option<Versitygw> {
    let gopath = Command::new("go").args(["env", "GOPATH"]).output().ok()?;
    let binary = PathBuf::from(String::from_utf8_lossy(&gopath.stdout).trim()).join("bin/versitygw");
    if !binary.exists() {
        eprintln!(
            "versitygw is not installed (go install github.com/versity/versitygw/cmd/versitygw@v1.8.0): no peer row"
        );
        return None;
    }
    // versitygw takes a port, not a listener: one the kernel just gave out.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (access, secret) = VERSITYGW_KEY;
    let child = Command::new(binary)
        .args(["--access", access, "--secret", secret, "--port", &format!("127.0.0.1:{port}")])
        .args(["posix", root.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    for _ in 0..100 {
        if std::net::TcpStream::connect(addr).is_ok() {
            return Some(Versitygw { child, addr, endpoint: format!("http://{addr}") });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}
