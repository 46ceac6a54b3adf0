//! `shardcache get`: a whole shard to a file, verified.

use super::*;

pub async fn get(server: &Server, dataset: &str, shard: &str, output: &Path) -> anyhow::Result<()> {
    let client = server.client().await?;
    let started = Instant::now();
    let mut stream = client.stream_shard(dataset, shard, 0, None).await?;
    let progress = progress_bar(stream.end());
    let mut sink = Output::open(output).await?;
    let result = async {
        let (mut chunks, mut version) = (0u64, String::new());
        while let Some(chunk) = stream.next_chunk().await? {
            sink.write(&chunk.data).await?;
            progress.inc(chunk.data.len() as u64);
            chunks += 1;
            version = chunk.version;
        }
        anyhow::Ok((chunks, version))
    }
    .await;
    progress.finish_and_clear();
    let (chunks, version) = match result {
        Ok(done) => {
            sink.commit().await?;
            done
        }
        Err(e) => {
            sink.abandon().await;
            return Err(e);
        }
    };
    let (bytes, secs) = (stream.end(), started.elapsed().as_secs_f64());
    eprintln!(
        "{dataset}/{shard} -> {}: {bytes} bytes in {chunks} chunks, CRC32C verified, version {version}, \
         {secs:.2} s ({:.1} MB/s)",
        output.display(),
        bytes as f64 / secs.max(1e-9) / 1e6
    );
    Ok(())
}

/// Where `get` writes. A regular file (or a path that does not exist yet) is written to a
/// hidden partial file beside it and renamed over it when complete, so a reader never
/// sees half a shard. Anything else (a device such as `/dev/null`, a FIFO, a socket) is
/// written in place: renaming a file over `/dev/null` would replace the device for every
/// program on the machine. `-` is standard output.
enum Output {
    Stdout(tokio::io::Stdout),
    InPlace { file: tokio::fs::File, path: PathBuf },
    Renamed { file: tokio::fs::File, partial: PathBuf, path: PathBuf },
}

impl Output {
    async fn open(path: &Path) -> anyhow::Result<Self> {
        if path.as_os_str() == "-" {
            return Ok(Self::Stdout(tokio::io::stdout()));
        }
        let path = path.to_path_buf();
        let existing = match tokio::fs::metadata(&path).await {
            Ok(meta) => Some(meta),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", path.display())),
        };
        if let Some(meta) = existing.filter(|meta| !meta.is_file()) {
            anyhow::ensure!(!meta.is_dir(), "{} is a directory; give a file name", path.display());
            // No create, no truncate: the path is a device, FIFO or socket that exists.
            let file = tokio::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .await
                .with_context(|| format!("cannot open {}", path.display()))?;
            return Ok(Self::InPlace { file, path });
        }
        let file_name = path.file_name().and_then(|n| n.to_str()).unwrap_or("shard");
        let partial = path.with_file_name(format!(".{file_name}.partial"));
        let file = tokio::fs::File::create(&partial)
            .await
            .with_context(|| format!("cannot create {}", partial.display()))?;
        Ok(Self::Renamed { file, partial, path })
    }

    async fn write(&mut self, data: &[u8]) -> anyhow::Result<()> {
        match self {
            Self::Stdout(out) => out.write_all(data).await.context("cannot write to standard output"),
            Self::InPlace { file, path } | Self::Renamed { file, partial: path, .. } => {
                file.write_all(data).await.with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    /// Makes the written bytes the output: flushed, and for a regular file synced and
    /// renamed into place.
    async fn commit(self) -> anyhow::Result<()> {
        match self {
            Self::Stdout(mut out) => out.flush().await.context("cannot write to standard output"),
            Self::InPlace { mut file, path } => {
                file.flush().await.with_context(|| format!("cannot write {}", path.display()))
            }
            Self::Renamed { file, partial, path } => {
                let done = async {
                    file.sync_all().await?;
                    tokio::fs::rename(&partial, &path).await
                }
                .await;
                if done.is_err() {
                    let _ = tokio::fs::remove_file(&partial).await;
                }
                done.with_context(|| format!("cannot write {}", path.display()))
            }
        }
    }

    /// After a failed transfer: removes the partial file; a device or pipe keeps what
    /// reached it (there is nothing of ours to remove).
    async fn abandon(self) {
        if let Self::Renamed { partial, .. } = self {
            let _ = tokio::fs::remove_file(&partial).await;
        }
    }
}
