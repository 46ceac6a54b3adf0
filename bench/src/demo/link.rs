//! The demo's link-compression setups' table: the bytes fetched from the hub and what
//! they took on the link, per epoch.

use shardcache_proto::units::ByteSize;

/// Bytes over the link per epoch of a link-compression setup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkRow {
    pub setup: String,
    /// Bytes fetched from the hub (the spoke's count, decoded), and what crossed the link
    /// (the emulator's count: compressed bytes, framing, stats), in epochs 1 and 2.
    pub fetched: [u64; 2],
    pub on_link: [u64; 2],
}

const HEADER: &str = "| setup | epoch 1: fetched | epoch 1: on the link / dataset | epoch 2: on the link / dataset |\n|---|---|---|---|";

/// One row of the table, shares of a dataset of `dataset` bytes.
pub fn row(row: &LinkRow, dataset: u64) -> String {
    let share = |b: u64| b as f64 / dataset as f64;
    format!(
        "| {} | {} | {:.3} | {:.3} |",
        row.setup,
        ByteSize(row.fetched[0]).human(),
        share(row.on_link[0]),
        share(row.on_link[1])
    )
}

/// The table as a section of results.md; empty without rows.
pub fn markdown(rows: &[LinkRow], dataset: u64) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let rows: Vec<String> = rows.iter().map(|r| row(r, dataset)).collect();
    format!(
        "\nBytes over the link per epoch, 2 Gbit/s link, zipf tokens (samples/s and GPU utilisation: the \
         table's zipf rows):\n\n{HEADER}\n{}\n",
        rows.join("\n")
    )
}
