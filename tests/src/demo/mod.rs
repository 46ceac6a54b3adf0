//! The seed experiment reproduced (`make demo`, binary `seed-demo`): a simulated
//! data-parallel trainer reading a tokenised dataset across a 60 ms link, through the
//! hub directly, through the spoke cold, through the spoke with the epoch's order
//! prefetched, and through the peer users would build instead (nginx `proxy_cache`).
//! See ../shared/seed/SEED.md for the run this reproduces.

pub mod nginx;
pub mod readers;
pub mod report;
pub mod trainer;

/// Sums every series of `name` (all label sets) in a Prometheus text scrape.
pub fn metric_sum(scrape: &str, name: &str) -> f64 {
    scrape
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `GET /metrics` from a spoke's metrics address (HTTP/1.0, as Prometheus would).
pub async fn scrape(metrics_addr: &str) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(metrics_addr).await?;
    socket.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").await?;
    let mut text = String::new();
    socket.read_to_string(&mut text).await?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn metric_sums_cover_every_label_set_and_only_that_name() {
        let scrape = "# HELP x\nhits_total{dataset=\"a\"} 3\nhits_total{dataset=\"b\"} 4\nhits_total_other 9\nhits_total 1\n";
        assert_eq!(super::metric_sum(scrape, "hits_total"), 8.0);
    }
}
