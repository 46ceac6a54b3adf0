//! The demo's setup 3: the hub's link compression, off and at its default, over a link
//! capped at 2 Gbit/s.

use super::*;

impl Demo {
    /// Setup 3 over a link capped at 2 Gbit/s, on `gen --tokens zipf` data, with the
    /// hub's link compression off and at its default.
    pub(super) async fn compression_setups(&mut self, work: &std::path::Path) -> anyhow::Result<()> {
        let data = work.join("data-zipf");
        generate(&GenSpec {
            dir: data.clone(),
            dataset: DATASET.into(),
            shards: self.layout.shards,
            shard_size: self.args.shard_size.0,
            record_size: SAMPLE,
            seed: 0,
            tokens: Tokens::Zipf,
        })?;
        let default = hub_server::config::DEFAULT_COMPRESSION_LEVEL;
        for (level, label) in [(0, "off".to_owned()), (default, format!("zstd {default}"))] {
            let hub = HubProcess::start(&data, &["--link-compression-level", &level.to_string()]);
            let hub_addr = hub.endpoint.trim_start_matches("http://").parse()?;
            let proxy = ProxyProcess::start(hub_addr, &["--rtt", self.args.rtt.as_str(), "--rate", "2Gbit"]);
            let cache = tempfile::tempdir_in(work)?;
            // Every fetch asks for zstd: the hub's level decides, not the spoke's `auto`.
            let spoke_args = ["--capacity", "8GiB", "--hub-compression", "zstd"];
            let spoke = SpokeProcess::start(&proxy.endpoint, cache.path(), &spoke_args);
            let read =
                readers::grpc(Client::connect(&spoke.endpoint).await?, DATASET, self.names.clone(), SAMPLE);
            let control = CacheClient::connect(&spoke.endpoint).await?;
            let setup = format!("zipf tokens, 2 Gbit/s link, compression {label}, cold + prefetch");
            // After each epoch, once the spoke has nothing in flight and the link is still
            // (a chunk filled beside an epoch's last reads may still be arriving): the bytes
            // fetched (the spoke's count, decoded) and what crossed the link (the wire's),
            // from the start of the setup.
            let start = wire::settled_spoke(&proxy, &control).await;
            let marks = Arc::new(Mutex::new(Vec::new()));
            let (mark_control, mark_marks, proxy) = (control.clone(), marks.clone(), Arc::new(proxy));
            let mark_proxy = proxy.clone();
            let after_epoch: AfterEpoch = Arc::new(move || {
                let (control, marks, proxy) = (mark_control.clone(), mark_marks.clone(), mark_proxy.clone());
                async move {
                    let (count, received) = wire::settled_spoke(proxy.as_ref(), &control).await;
                    let status = control.status().await.unwrap_or_default();
                    let fetched =
                        status.datasets.iter().find(|d| d.dataset == DATASET).map_or(0, |d| d.upstream_bytes);
                    let (wire, received) = (count.since(start.0).to_client, received - start.1);
                    assert!(
                        wire::agrees(received, wire),
                        "the spoke read {received} bytes from its hub, the wire {wire}"
                    );
                    marks.lock().unwrap().push((fetched, wire));
                }
                .boxed()
            });
            self.run_marked(
                &setup,
                read,
                Some(readers::spoke_counter(&spoke.metrics_addr)),
                Some(control),
                Some(after_epoch),
            )
            .await?;
            let marks = marks.lock().unwrap().clone();
            anyhow::ensure!(marks.len() == 2, "{setup}: counted after {} epochs", marks.len());
            let row = link::LinkRow {
                setup,
                fetched: [marks[0].0, marks[1].0 - marks[0].0],
                on_link: [marks[0].1, marks[1].1 - marks[0].1],
            };
            anyhow::ensure!(
                row.fetched[0] == self.dataset_bytes(),
                "{}: epoch 1 fetched the dataset once: fetched {} of {} bytes",
                row.setup,
                row.fetched[0],
                self.dataset_bytes()
            );
            println!("{}", link::row(&row, self.dataset_bytes()));
            self.link_rows.push(row);
        }
        Ok(())
    }
}
