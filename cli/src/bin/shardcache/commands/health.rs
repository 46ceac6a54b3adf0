//! `shardcache health`: exits non-zero unless the server reports SERVING.

use super::*;

/// Exits non-zero unless the server reports SERVING for `service`.
pub async fn health(server: &Server, service: &str) -> anyhow::Result<()> {
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let channel = shardcache_client::connect::connect_channel(&server.endpoint, &server.options).await?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest { service: service.to_owned() })
        .await
        .with_context(|| format!("health check of {}", server.endpoint))?;
    let status = response.into_inner().status();
    println!("{}", status.as_str_name());
    anyhow::ensure!(status == tonic_health::pb::health_check_response::ServingStatus::Serving, "not serving");
    // A spoke stays SERVING through a hub outage (its cache still serves); say so, and
    // why, when it tells this caller (a hub, or a token without `control`, does not).
    if let Some(status) = hub_status(server).await.filter(|s| !s.hub_trouble.is_empty()) {
        println!("{}", hubs_unreachable(status.hub_trouble_age_s, &status.hub_trouble));
    }
    Ok(())
}
