//! A group of spokes in this process (`--peers`), each on its own bound listener and
//! cache directory, each reaching the hub through the upstream its index is given: the
//! setup every group test shares (a member behind a link that will hang, members 200 ms
//! from the hub, ...).

use tokio::net::TcpListener;

use spoke_cache::PeerGroup;

use crate::{TestSpoke, spoke_options};

/// A running group: its members, their URLs (as the group lists them) and directories.
#[derive(Debug)]
pub struct TestGroup {
    pub spokes: Vec<TestSpoke>,
    pub urls: Vec<String>,
    _dirs: Vec<tempfile::TempDir>,
}

impl TestGroup {
    /// The URLs a group of `members` will have, with the listeners to start it on: a
    /// test that must choose by ownership (which hashes the URLs) does so before the
    /// members start ([`TestGroup::start_on`]).
    pub async fn bind(members: usize) -> (Vec<TcpListener>, Vec<String>) {
        let mut listeners = Vec::new();
        for _ in 0..members {
            listeners.push(TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let urls = listeners.iter().map(|l| format!("http://{}", l.local_addr().unwrap())).collect();
        (listeners, urls)
    }

    /// A group of `members`, member `i` fetching from `upstream(i)` with the test
    /// options (`spoke_options`).
    pub async fn start(members: usize, upstream: impl Fn(usize) -> String) -> Self {
        let (listeners, urls) = Self::bind(members).await;
        Self::start_on(listeners, urls, upstream).await
    }

    /// [`TestGroup::start`] on listeners bound by [`TestGroup::bind`].
    pub async fn start_on(
        listeners: Vec<TcpListener>,
        urls: Vec<String>,
        upstream: impl Fn(usize) -> String,
    ) -> Self {
        let dirs: Vec<_> = (0..listeners.len()).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut spokes = Vec::new();
        for (i, listener) in listeners.into_iter().enumerate() {
            let mut options = spoke_options(&upstream(i));
            options.group = Some(PeerGroup {
                spec: urls.join(","),
                me: urls[i].clone(),
                credentials: Default::default(),
            });
            spokes.push(TestSpoke::start_on(listener, dirs[i].path(), options).await);
        }
        Self { spokes, urls, _dirs: dirs }
    }

    /// The group's list, as `--peers` and a group client take it.
    pub fn spec(&self) -> String {
        self.urls.join(",")
    }
}
