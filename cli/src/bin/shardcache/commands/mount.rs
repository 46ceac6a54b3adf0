//! `shardcache mount`: a dataset as a read-only filesystem.

use super::*;

/// `shardcache mount`: serves the mount until it is unmounted; prints a line once it is
/// in place (the contract for scripts and tests).
pub async fn mount(
    server: &Server,
    mountpoint: &std::path::Path,
    options: shardcache_cli::mount::MountOptions,
) -> anyhow::Result<()> {
    let _traces = shardcache_serving::server::init_tracing("shardcache-mount");
    shardcache_serving::allocator::rerun_with_malloc_tunables("mount");
    let client = server.client().await?;
    shardcache_cli::mount::serve(client, mountpoint, options, || {
        println!("shardcache mounted {} on {}", server.endpoint, mountpoint.display());
    })
    .await
}
