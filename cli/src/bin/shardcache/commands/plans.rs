//! `shardcache plans`: the jobs' access plans a spoke holds, and dropping one.

use super::*;

/// The access plans the caller may see (its own; an operator's: everyone's).
pub async fn plans(server: &Server) -> anyhow::Result<()> {
    let status = server.cache().await?.status().await?;
    println!("{:<24} {:<40} {:>10} {:>10} {:>6}", "PRINCIPAL", "PLAN", "CURSOR", "POSITIONS", "LAG");
    for p in &status.plans {
        let principal = if p.principal.is_empty() { "-" } else { p.principal.as_str() };
        println!("{principal:<24} {:<40} {:>10} {:>10} {:>6}", p.job, p.cursor, p.positions, p.lag);
    }
    Ok(())
}

/// Withdraws the caller's plans of `job` and of its readers (`JOB/...`).
pub async fn drop_plans(server: &Server, job: &str) -> anyhow::Result<()> {
    let cache = server.cache().await?;
    let status = cache.status().await?;
    let mine = |p: &&shardcache_proto::v1::PlanStatus| {
        p.principal == status.principal && (p.job == job || p.job.starts_with(&format!("{job}/")))
    };
    let names: std::collections::BTreeSet<&str> =
        status.plans.iter().filter(mine).map(|p| p.job.as_str()).collect();
    anyhow::ensure!(
        !names.is_empty(),
        "no plan of job {job:?} for {:?} here (`shardcache plans` lists them)",
        status.principal
    );
    for name in &names {
        cache.set_plan(name, 0, "", &[]).await?;
    }
    println!("dropped {} plans of job {job}", names.len());
    Ok(())
}
