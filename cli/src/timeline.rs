//! A job's timeline as a PNG (`shardcache report JOB --png FILE`): samples/s and the data
//! wait's share (one minus the GPU utilisation) of each bucket of the spoke's timeline
//! (`JobReport.timeline`: the steps folded in each bucket of wall clock), against seconds
//! since the job's first step. Text needs a TrueType font: DejaVu Sans where it is
//! installed (`fonts-dejavu-core`); without one the plot is drawn without its labels.

use std::path::Path;

use plotters::prelude::*;
use shardcache_proto::v1::JobReport;

const FONTS: [&str; 2] =
    ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/dejavu/DejaVuSans.ttf"];

/// Registers DejaVu Sans for the plot's text; whether there was one.
fn font() -> bool {
    let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else { return false };
    // plotters keeps registered fonts for the life of the process.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .is_ok()
}

/// One point a bucket: (seconds since the first bucket, samples/s, data wait %).
pub fn points(report: &JobReport) -> Vec<(f64, f64, f64)> {
    let start = report.timeline.first().map_or(0, |p| p.at_ms);
    report
        .timeline
        .iter()
        .filter(|p| p.wall_us > 0)
        .map(|p| {
            let at = (p.at_ms - start) as f64 / 1e3;
            let wall = p.wall_us as f64 / 1e6;
            (at, p.samples as f64 / wall, p.wait_us as f64 * 100.0 / p.wall_us as f64)
        })
        .collect()
}

/// Draws `report`'s timeline into `path` (1200 x 700); an error when it has none.
pub fn write_png(report: &JobReport, path: &Path) -> anyhow::Result<()> {
    let points = points(report);
    anyhow::ensure!(!points.is_empty(), "job {:?} has no steps in its timeline yet", report.job);
    let labels = font();
    let root = BitMapBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let end = points.last().map_or(1.0, |p| p.0).max(1.0);
    let max_rate = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
    for (area, (title, max, pick)) in [top, bottom].iter().zip([
        (format!("job {}: samples/s", report.job), max_rate, 1),
        ("data wait, % of step time (100 - GPU utilisation)".to_owned(), 100.0, 2),
    ]) {
        let mut builder = ChartBuilder::on(area);
        builder.margin(12).x_label_area_size(if labels { 36 } else { 4 }).y_label_area_size(if labels {
            64
        } else {
            4
        });
        if labels {
            builder.caption(title, ("sans-serif", 22));
        }
        let mut chart = builder.build_cartesian_2d(0.0..end, 0.0..max)?;
        let mut mesh = chart.configure_mesh();
        if labels {
            mesh.x_desc("seconds since the job's first step");
        } else {
            mesh.disable_x_mesh().disable_y_mesh().x_labels(0).y_labels(0);
        }
        mesh.draw()?;
        let series: Vec<(f64, f64)> =
            points.iter().map(|p| (p.0, if pick == 1 { p.1 } else { p.2 })).collect();
        chart.draw_series(LineSeries::new(series.iter().copied(), BLUE.stroke_width(2)))?;
        // A mark at each bucket: a job of a few seconds has few.
        chart.draw_series(series.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))?;
    }
    root.present()?;
    Ok(())
}
