//! A job's timeline as a PNG (`shardcache report JOB --png FILE`): samples/s and the data
//! wait's share (one minus the GPU utilisation) of each bucket of the spoke's timeline
//! (`JobReport.timeline`: the steps folded in each bucket of wall clock), against seconds
//! since the job's first step. Text needs a TrueType font: DejaVu Sans where it is
//! installed (`fonts-dejavu-core`); without one the plot is drawn without its labels.
//! The image is drawn into memory and written as a PNG of stored (uncompressed) deflate
//! blocks, 2.5 MB: the CLI carries no compression library of its own for a plot.

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
    let mut rgb = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    draw(&mut rgb, report, &points, labels)?;
    std::fs::write(path, png(WIDTH, HEIGHT, &rgb))?;
    Ok(())
}

const WIDTH: u32 = 1200;
const HEIGHT: u32 = 700;

/// Draws the two panels into `rgb` (WIDTH x HEIGHT, 3 bytes a pixel).
fn draw(rgb: &mut [u8], report: &JobReport, points: &[(f64, f64, f64)], labels: bool) -> anyhow::Result<()> {
    let root = BitMapBackend::with_buffer(rgb, (WIDTH, HEIGHT)).into_drawing_area();
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

/// A PNG of `rgb` (8-bit RGB): its scanlines unfiltered in stored deflate blocks.
pub fn png(width: u32, height: u32, rgb: &[u8]) -> Vec<u8> {
    let mut raw = Vec::with_capacity(rgb.len() + height as usize);
    for row in rgb.chunks((width * 3) as usize) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut zlib = vec![0x78, 0x01];
    let mut blocks = raw.chunks(65535).peekable();
    while let Some(block) = blocks.next() {
        zlib.push(u8::from(blocks.peek().is_none())); // BFINAL on the last; BTYPE 00: stored
        let len = block.len() as u16;
        zlib.extend(len.to_le_bytes());
        zlib.extend((!len).to_le_bytes());
        zlib.extend_from_slice(block);
    }
    zlib.extend(adler32(&raw).to_be_bytes());
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::new();
    header.extend(width.to_be_bytes());
    header.extend(height.to_be_bytes());
    header.extend([8, 2, 0, 0, 0]); // 8 bits, RGB, deflate, no filter method, no interlace
    png_chunk(&mut out, b"IHDR", &header);
    png_chunk(&mut out, b"IDAT", &zlib);
    png_chunk(&mut out, b"IEND", &[]);
    out
}

fn png_chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend((data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend(crc32(kind, data).to_be_bytes());
}

/// zlib's checksum.
fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &byte in chunk {
            a += u32::from(byte);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

/// PNG's CRC-32 (IEEE) of a chunk's type and data.
fn crc32(kind: &[u8], data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in kind.iter().chain(data) {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    #[test]
    fn checksums_are_zlibs_and_pngs() {
        assert_eq!(super::adler32(b"Wikipedia"), 0x11E6_0398);
        assert_eq!(super::crc32(b"IEND", &[]), 0xAE42_6082);
    }
}
