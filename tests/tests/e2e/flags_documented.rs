//! The docs' flag tables (the hub's in docs/deploying.md, the spoke's in docs/cache.md;
//! the README and every page of docs/ are read as one text) are what the servers take:
//! every `--flag` row names the
//! environment variable the flag really reads (the servers give each flag `HUB_` or
//! `SPOKE_` and its name: `shardcache_serving::flags`) and the default `--help` shows,
//! every flag of either server has a row, and `--help` describes every flag.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use hub_server::config::HubArgs;
use shardcache_serving::flags::command;
use spoke_cache::serve::config::SpokeArgs;

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

/// `--flag` -> its default as the README's table gives it (the third cell).
fn documented_defaults(readme: &str, prefix: &str) -> BTreeMap<String, String> {
    let mut rows = BTreeMap::new();
    for line in readme.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !cells[2].starts_with(&format!("`{prefix}")) {
            continue;
        }
        for flag in cells[1].split('`').skip(1).step_by(2).filter_map(|f| f.split(' ').next()) {
            rows.insert(flag.to_owned(), cells[3].to_owned());
        }
    }
    rows
}

/// What the README's default cell must say for `arg`: its `--help` default in
/// backquotes, `off` for a switch, and for a flag without a default, anything but a
/// lone value (a word: none, (required), system roots...).
fn check_default(arg: &clap::Arg, cell: &str) {
    let flag = format!("--{}", arg.get_long().unwrap_or_default());
    let defaults: Vec<String> =
        arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        assert_eq!(cell, "off", "{flag}: a switch is off by default");
    } else if defaults.is_empty() || defaults == [""] {
        assert!(!cell.starts_with('`'), "{flag}: the README gives a default ({cell}) that --help does not");
    } else {
        assert_eq!(cell, format!("`{}`", defaults.join(",")), "{flag}: the README's default is not --help's");
    }
}

/// One default per flag: where the README's prose says "`--flag` (N)" of a flag of
/// `command`, N is its default (sizes compared as sizes: `64 MiB` is `64MiB`).
fn check_prose(readme: &str, command: &clap::Command) {
    use shardcache_proto::units::ByteSize;
    for (at, _) in readme.match_indices("`--") {
        let rest = &readme[at + 1..];
        let Some((flag, after)) = rest.split_once('`') else { continue };
        let Some(said) = after.strip_prefix(" (").and_then(|a| a.split_once(')')).map(|(n, _)| n) else {
            continue;
        };
        let arg = command.get_arguments().find(|a| a.get_long().is_some_and(|l| format!("--{l}") == flag));
        let (Some(arg), true) = (arg, said.starts_with(|c: char| c.is_ascii_digit())) else { continue };
        let default = arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned());
        let default = default.unwrap_or_else(|| panic!("{flag} ({said}): the flag has no default"));
        let same = match (said.parse::<ByteSize>(), default.parse::<ByteSize>()) {
            (Ok(a), Ok(b)) => a == b,
            _ => said == default,
        };
        assert!(same, "the README says {flag} ({said}) where its default is {default}");
    }
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
    let workspace = shardcache_tests::workspace_dir();
    let mut pages: Vec<_> =
        std::fs::read_dir(workspace.join("docs")).unwrap().flatten().map(|e| e.path()).collect();
    pages.sort();
    pages.insert(0, workspace.join("README.md"));
    let readme: String =
        pages.iter().map(|p| std::fs::read_to_string(p).unwrap()).collect::<Vec<_>>().join("\n");
    assert!(readme.contains("| `--capacity"), "the spoke's flag table was read");
    let servers = [
        (hub_server::config::ENV_PREFIX, command::<HubArgs>(hub_server::config::ENV_PREFIX)),
        (
            spoke_cache::serve::config::ENV_PREFIX,
            command::<SpokeArgs>(spoke_cache::serve::config::ENV_PREFIX),
        ),
    ];
    for (prefix, command) in servers {
        let (real, documented) = (flags(&command), documented(&readme, prefix));
        assert_eq!(documented, real, "the README's {prefix} table against the server's flags");
        check_prose(&readme, &command);
        let defaults = documented_defaults(&readme, prefix);
        for arg in
            command.get_arguments().filter(|a| a.get_long().is_some_and(|l| l != "help" && l != "version"))
        {
            let flag = format!("--{}", arg.get_long().unwrap_or_default());
            assert!(arg.get_help().is_some(), "{flag} has no description in --help");
            check_default(arg, &defaults[&flag]);
        }
    }
}
