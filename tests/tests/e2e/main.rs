//! shardcache's end-to-end tests, one binary with a module per area (as linkerd2-proxy's
//! integration tests): real hub and spoke servers on `127.0.0.1:0`, real RocksDB, a real
//! S3-compatible server, real TLS, real processes of the built binaries. One binary links
//! RocksDB and the AWS SDK once instead of once per area, and its tests share the
//! harness's threads (`cargo test --test e2e MODULE::` runs one area).

mod cli_and_process;
mod first_hour_errors;
mod flags_documented;
mod hub_bad_input;
mod hub_reads;
mod hub_s3;
mod job_report;
mod link_compression;
mod link_counted;
mod local_door;
mod mount;
mod prometheus;
mod s3_door;
mod samples_index;
mod sdk_verification;
mod security;
mod security_cli;
mod seed_demo;
mod spoke_admission;
mod spoke_capacity;
mod spoke_cli;
mod spoke_cold_reads;
mod spoke_disk;
mod spoke_durability;
mod spoke_fan_out;
mod spoke_faults;
mod spoke_group;
mod spoke_group_chaos;
mod spoke_group_gray;
mod spoke_group_membership;
mod spoke_group_secure;
mod spoke_group_trust;
mod spoke_plans;
mod spoke_reads;
mod spoke_samples;
mod spoke_soak;
mod tenancy;
mod traces;
mod wan_link;
