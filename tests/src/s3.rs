//! A real S3-compatible server for tests: moto's server mode (PyPI `moto[server]`,
//! installed by `make test`), started on `127.0.0.1:0`, and a client to fill it.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
};

use aws_sdk_s3::{Client, primitives::ByteStream};
use hub_server::source::s3::{S3Options, client};

/// A `moto_server` child process; killed when dropped.
#[derive(Debug)]
pub struct MotoServer {
    child: Child,
    pub endpoint: String,
}

impl MotoServer {
    /// Starts moto; `authenticated` turns on its IAM checks, so only known access keys
    /// are accepted (none are, which is how tests get "bad credentials").
    pub fn start(authenticated: bool) -> Self {
        let program = std::env::var("SHARDCACHE_MOTO_SERVER").unwrap_or_else(|_| "moto_server".into());
        let mut command = Command::new(&program);
        command.args(["-H", "127.0.0.1", "-p", "0"]).stdout(Stdio::null()).stderr(Stdio::piped());
        if authenticated {
            command.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let mut child = command.spawn().unwrap_or_else(|e| {
            panic!("cannot start {program} ({e}): `make test` installs moto[server]; or set SHARDCACHE_MOTO_SERVER")
        });
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let mut endpoint = None;
        // werkzeug reports " * Running on http://127.0.0.1:PORT" within its first lines.
        for line in stderr.lines().take(20) {
            let line = line.unwrap();
            if let Some(url) = line.split("Running on ").nth(1) {
                endpoint = Some(url.trim().to_owned());
                break;
            }
        }
        let endpoint = endpoint.unwrap_or_else(|| panic!("{program} did not report its address"));
        Self { child, endpoint }
    }

    /// How the hub reaches this server, with moto's test credentials.
    pub fn options(&self) -> S3Options {
        self.options_with(("testing", "testing"))
    }

    pub fn options_with(&self, credentials: (&str, &str)) -> S3Options {
        S3Options {
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            path_style: true,
            static_credentials: Some((credentials.0.into(), credentials.1.into())),
        }
    }

    /// A client to create buckets and objects.
    pub async fn client(&self) -> Client {
        client(&self.options()).await
    }
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Puts `data` at `bucket/key`.
pub async fn put(client: &Client, bucket: &str, key: &str, data: Vec<u8>) {
    client.put_object().bucket(bucket).key(key).body(ByteStream::from(data)).send().await.unwrap();
}
