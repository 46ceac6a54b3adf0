//! `shardcache report`: a job's own table of data wait per phase and rank.

use super::*;

/// Job `job`'s own table (`principal`'s, for an operator), as markdown; its timeline
/// into `png` when given.
pub async fn report(server: &Server, job: &str, principal: &str, png: Option<&Path>) -> anyhow::Result<()> {
    let report = server.cache().await?.job_report(job, principal).await?;
    print!("{}", shardcache_client::report::markdown(&report));
    if let Some(png) = png {
        shardcache_cli::timeline::write_png(&report, png)?;
        println!("\nwrote the timeline to {}", png.display());
    }
    Ok(())
}
