//! The README's flag tables are what the servers take: every `--flag` row names the
//! environment variable the flag really reads (the servers give each flag `HUB_` or
//! `SPOKE_` and its name: `shardcache_serving::flags`), and every flag of either server
//! has a row.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use hub_server::config::HubArgs;
use shardcache_serving::flags::command;
use spoke_cache::config::SpokeArgs;

/// `--flag` -> environment variable, for each flag of `command`.
fn flags(command: &clap::Command) -> BTreeMap<String, String> {
    command
        .get_arguments()
        .filter_map(|a| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            Some((format!("--{}", a.get_long()?), env))
        })
        .collect()
}

/// `--flag` -> environment variable, from the README rows of the server whose variables
/// start with `prefix`: "| `--flag ARG`, `--other` | `PREFIX_FLAG`, `PREFIX_OTHER` | ...".
fn documented(readme: &str, prefix: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in readme.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = line.split('|').collect();
        let names = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.split(' ').next().unwrap_or_default().to_owned())
                .collect()
        };
        let (flags, envs) = (names(cells[1]), names(cells[2]));
        if !envs.first().is_some_and(|e| e.starts_with(prefix)) {
            continue;
        }
        let flags: Vec<_> = flags.into_iter().filter(|f| f.starts_with("--")).collect();
        assert_eq!(flags.len(), envs.len(), "one variable per flag in: {line}");
        rows.extend(flags.into_iter().zip(envs));
    }
    rows
}

#[test]
fn the_readme_names_every_flag_and_its_environment_variable() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let servers = [
        (hub_server::config::ENV_PREFIX, command::<HubArgs>(hub_server::config::ENV_PREFIX)),
        (spoke_cache::config::ENV_PREFIX, command::<SpokeArgs>(spoke_cache::config::ENV_PREFIX)),
    ];
    for (prefix, command) in servers {
        let (real, documented) = (flags(&command), documented(&readme, prefix));
        assert_eq!(documented, real, "the README's {prefix} table against the server's flags");
    }
}
