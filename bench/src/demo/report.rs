//! The seed's table for our run (markdown and JSON) and a plot of samples/s and GPU
//! utilisation per batch for each setup (PNG).

use std::{path::Path, time::Duration};

use anyhow::Context;
use plotters::prelude::*;

use super::trainer::Step;
use crate::measure::percentiles;

/// One row of the table: one setup in one phase.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PhaseRow {
    pub setup: String,
    pub phase: String,
    pub steps: usize,
    /// Bytes the trainer read per second of the phase.
    pub read_mb_s: f64,
    /// One batch read (24 samples), request to last byte.
    pub read_p50_ms: f64,
    pub read_p99_ms: f64,
    pub gpu_util_pct: f64,
    pub samples_per_s: f64,
    /// Share of sample reads the local cache served; `None` without a cache.
    pub from_cache_pct: Option<f64>,
}

/// The row for `steps` (and their batch reads `reads`) of one phase.
pub fn phase_row(
    setup: &str,
    phase: &str,
    steps: &[Step],
    reads: &[Duration],
    global_batch: usize,
    from_cache_pct: Option<f64>,
) -> PhaseRow {
    let wall: f64 = steps.iter().map(|s| s.data_wait_s + s.compute_s).sum();
    let compute: f64 = steps.iter().map(|s| s.compute_s).sum();
    let bytes: u64 = steps.iter().map(|s| s.bytes).sum();
    let (p50, p99) = if reads.is_empty() { (0.0, 0.0) } else { percentiles(reads.to_vec()) };
    PhaseRow {
        setup: setup.to_owned(),
        phase: phase.to_owned(),
        steps: steps.len(),
        read_mb_s: bytes as f64 / wall / 1e6,
        read_p50_ms: p50 / 1e3,
        read_p99_ms: p99 / 1e3,
        gpu_util_pct: compute * 100.0 / wall,
        samples_per_s: (steps.len() * global_batch) as f64 / wall,
        from_cache_pct,
    }
}

/// The table as markdown.
pub fn markdown(rows: &[PhaseRow]) -> String {
    let mut out = String::from(
        "| setup | phase | read MB/s | batch read p50 / p99 | GPU util | samples/s | reads from local cache |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        out += &markdown_row(r);
        out.push('\n');
    }
    out
}

/// One row of the table, without the line end.
pub fn markdown_row(r: &PhaseRow) -> String {
    let cache = r.from_cache_pct.map_or("-".to_owned(), |p| format!("{p:.1}%"));
    format!(
        "| {} | {} | {:.0} | {:.2} / {:.2} ms | {:.1}% | {:.0} | {} |",
        r.setup, r.phase, r.read_mb_s, r.read_p50_ms, r.read_p99_ms, r.gpu_util_pct, r.samples_per_s, cache
    )
}

/// "ours / peer" for samples/s and batch p99 latency, phase by phase: the prefetched
/// spoke against the nginx peer (lines of a list; empty without the peer's rows).
pub fn ratios(rows: &[PhaseRow]) -> String {
    let ours = rows.iter().filter(|r| r.setup == "spoke, cold + prefetch");
    let mut out = String::new();
    for r in ours {
        if let Some(peer) = rows.iter().find(|p| p.setup == "nginx proxy_cache (peer)" && p.phase == r.phase)
        {
            out += &format!(
                "- {}: samples/s ours/peer {:.2}x, batch p99 peer/ours {:.1}x, GPU util {:.1}% vs {:.1}%\n",
                r.phase,
                r.samples_per_s / peer.samples_per_s,
                peer.read_p99_ms / r.read_p99_ms.max(1e-9),
                r.gpu_util_pct,
                peer.gpu_util_pct
            );
        }
    }
    out
}

/// Plots samples/s (smoothed over 5 steps) and GPU utilisation per step, epochs back to
/// back (a grey line at each epoch's end), one line per setup. Text needs a TrueType font: DejaVu Sans
/// (`fonts-dejavu-core`, which scripts/demo.sh installs when missing).
pub fn plot(
    path: &Path,
    series: &[(String, Vec<Step>)],
    global_batch: usize,
    epoch_steps: usize,
) -> anyhow::Result<()> {
    let font = ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .context("no DejaVuSans.ttf (install fonts-dejavu-core) to draw the plot's text")?;
    // plotters keeps registered fonts for the life of the process.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(font.into_boxed_slice()))
        .map_err(|_| anyhow::anyhow!("DejaVuSans.ttf is not a usable font"))?;

    let root = BitMapBackend::new(path, (1400, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(450);
    let steps = series.iter().map(|(_, s)| s.len()).max().unwrap_or(1);
    let rate = |s: &Step| global_batch as f64 / (s.data_wait_s + s.compute_s);
    let max_rate = series.iter().flat_map(|(_, s)| s.iter().map(rate)).fold(1.0, f64::max) * 1.1;
    let colors = [RED, BLUE, GREEN, MAGENTA, BLACK];

    let mut chart = ChartBuilder::on(&top)
        .caption("samples/s per batch (5-step mean)", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0..steps, 0.0..max_rate)?;
    chart.configure_mesh().x_desc("batch (epochs back to back)").y_desc("samples/s").draw()?;
    for ((name, s), color) in series.iter().zip(colors) {
        let points = (0..s.len()).map(|i| {
            let window = &s[i.saturating_sub(4)..=i];
            (i, window.iter().map(rate).sum::<f64>() / window.len() as f64)
        });
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    for end in (epoch_steps..steps).step_by(epoch_steps.max(1)) {
        chart.draw_series(LineSeries::new([(end, 0.0), (end, max_rate)], BLACK.mix(0.3)))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;

    let mut chart = ChartBuilder::on(&bottom)
        .caption("simulated GPU utilisation per batch", ("sans-serif", 24))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0..steps, 0.0..105.0)?;
    chart.configure_mesh().x_desc("batch (epochs back to back)").y_desc("GPU util %").draw()?;
    for ((name, s), color) in series.iter().zip(colors) {
        let points =
            s.iter().enumerate().map(|(i, s)| (i, s.compute_s * 100.0 / (s.data_wait_s + s.compute_s)));
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present()?;
    Ok(())
}
