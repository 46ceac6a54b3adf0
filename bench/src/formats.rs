//! Datasets in the formats the SDK reads, written by small writers of their own (for
//! benchmarks: the tests check the readers against each format's reference tools).

use std::path::Path;

use shardcache_tests::next_random;

/// Megatron shards of documents of uint16 tokens, `min..=max` bytes each; returns
/// their mean size.
pub fn megatron(dir: &Path, shards: u64, shard_bytes: u64, min: u64, max: u64) -> u64 {
    std::fs::create_dir_all(dir).unwrap();
    let (mut state, mut total, mut count) = (7u64, 0u64, 0u64);
    for shard in 0..shards {
        let (mut bin, mut lengths) = (Vec::new(), Vec::new());
        while (bin.len() as u64) < shard_bytes {
            let bytes = (min + next_random(&mut state) % (max - min + 1)) & !1;
            lengths.push((bytes / 2) as u32);
            bin.extend((0..bytes).map(|i| (i as u8) ^ (shard as u8)));
            (total, count) = (total + bytes, count + 1);
        }
        std::fs::write(dir.join(format!("part-{shard}.bin")), &bin).unwrap();
        std::fs::write(dir.join(format!("part-{shard}.idx")), megatron_idx(&lengths)).unwrap();
    }
    total / count
}

/// An .idx as Megatron writes it: uint16 tokens (code 8), one sequence per document.
fn megatron_idx(lengths: &[u32]) -> Vec<u8> {
    let mut out = b"MMIDIDX\x00\x00".to_vec();
    out.extend_from_slice(&1u64.to_le_bytes());
    out.push(8);
    out.extend_from_slice(&(lengths.len() as u64).to_le_bytes());
    out.extend_from_slice(&(lengths.len() as u64 + 1).to_le_bytes());
    lengths.iter().for_each(|l| out.extend_from_slice(&l.to_le_bytes()));
    let mut at = 0u64;
    for l in lengths {
        out.extend_from_slice(&at.to_le_bytes());
        at += u64::from(*l) * 2;
    }
    (0..=lengths.len() as u64).for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
    out
}

/// `.npy` files of `tokens` uint16 values each.
pub fn npy(dir: &Path, shards: u64, tokens: u64) {
    std::fs::create_dir_all(dir).unwrap();
    for shard in 0..shards {
        let mut out = shardcache_formats::tokens::npy_header("<u2", &format!("({tokens},)"));
        out.extend((0..tokens).flat_map(|t| ((t ^ shard) as u16).to_le_bytes()));
        std::fs::write(dir.join(format!("part-{shard}.npy")), out).unwrap();
    }
}

/// An MDS dataset (index.json + shards) of one `bytes` column, `samples` samples of
/// `size` bytes per shard, laid out as MosaicML Streaming's MDSWriter lays them out.
pub fn mds(dir: &Path, shards: u64, samples: u64, size: u64) {
    std::fs::create_dir_all(dir).unwrap();
    let mut entries = Vec::new();
    for shard in 0..shards {
        let config = b"{}";
        let head = 4 + 4 * (samples + 1) + config.len() as u64;
        let mut out = (samples as u32).to_le_bytes().to_vec();
        for i in 0..=samples {
            out.extend_from_slice(&((head + i * (size + 4)) as u32).to_le_bytes());
        }
        out.extend_from_slice(config);
        for i in 0..samples {
            out.extend_from_slice(&(size as u32).to_le_bytes());
            out.extend((0..size).map(|b| (b ^ i ^ shard) as u8));
        }
        let name = format!("shard.{shard:05}.mds");
        entries.push(serde_json::json!({
            "column_encodings": ["bytes"], "column_names": ["tokens"], "column_sizes": [null],
            "compression": null, "format": "mds", "hashes": [],
            "raw_data": {"basename": name, "bytes": out.len(), "hashes": {}},
            "samples": samples, "size_limit": null, "version": 2, "zip_data": null,
        }));
        std::fs::write(dir.join(&name), out).unwrap();
    }
    let index = serde_json::json!({"shards": entries, "version": 2});
    std::fs::write(dir.join("index.json"), index.to_string()).unwrap();
}

/// WebDataset `.tar` shards of `samples` samples, each a `size`-byte `.bin` field and a
/// `.cls` field (ustar headers, as Python's tarfile writes them).
pub fn webdataset(dir: &Path, shards: u64, samples: u64, size: u64) {
    std::fs::create_dir_all(dir).unwrap();
    for shard in 0..shards {
        let mut out = Vec::new();
        for i in 0..samples {
            let data: Vec<u8> = (0..size).map(|b| (b ^ i ^ shard) as u8).collect();
            tar_member(&mut out, &format!("{i:06}.bin"), &data);
            tar_member(&mut out, &format!("{i:06}.cls"), (i % 10).to_string().as_bytes());
        }
        out.extend_from_slice(&[0; 1024]);
        std::fs::write(dir.join(format!("shard-{shard:04}.tar")), out).unwrap();
    }
}

/// One regular file of a tar: its ustar header, then its bytes to a 512-byte boundary.
fn tar_member(out: &mut Vec<u8>, name: &str, data: &[u8]) {
    let mut header = [0u8; 512];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[156] = b'0';
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}
