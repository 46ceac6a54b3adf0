//! The spoke's data path is one way: no module of `spoke-cache` reaches (through `use
//! crate::...` or a `crate::` path) a module that reaches back to it. Read from the
//! sources, so a part that starts calling back into its caller fails here, naming the
//! cycle.

#![allow(clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The first path segment of each item `use crate::...` and `crate::...` name in `text`
/// (`use crate::{a::B, c};` names `a` and `c`).
fn referenced(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let code: String =
        text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // A group: the first segment of every item at the top level of the braces.
            let (mut depth, mut item_start, mut end) = (0, 0, group.len());
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = i;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(first_segment(&group[item_start..i]));
                        item_start = i + 1;
                    }
                    _ => {}
                }
            }
            names.insert(first_segment(&group[item_start..end]));
        } else {
            names.insert(first_segment(rest));
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

fn first_segment(item: &str) -> String {
    item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// The module each name `lib.rs` re-exports comes from (`pub use server::{PeerGroup}`).
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    for line in lib.lines().filter_map(|l| l.strip_prefix("pub use ")) {
        let (module, items) = line.split_once("::").unwrap();
        for item in items.trim_matches(|c| c == '{' || c == '}' || c == ';').split(',') {
            map.insert(item.trim().to_owned(), module.to_owned());
        }
    }
    map
}

/// A cycle in `edges`, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

#[test]
fn the_spokes_modules_import_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spoke-cache/src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap();
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ").or_else(|| l.strip_prefix("mod ")))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect();
    assert!(modules.contains("fetch") && modules.contains("suppliers"), "{modules:?}");
    let reexported = reexports(&lib);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(&src) {
        let relative = file.strip_prefix(&src).unwrap();
        let module = relative.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_owned();
        if !modules.contains(&module) {
            continue; // lib.rs, main.rs
        }
        for name in referenced(&std::fs::read_to_string(&file).unwrap()) {
            let target = if modules.contains(&name) { Some(&name) } else { reexported.get(&name) };
            if let Some(target) = target.filter(|t| **t != module) {
                edges.entry(module.clone()).or_default().insert(target.clone());
            }
        }
    }
    assert!(edges.get("cache").is_some_and(|e| e.contains("fetch")), "the graph was read: {edges:?}");
    assert_eq!(cycle(&edges), None, "modules that import each other");
    let reaches_cache: Vec<&String> =
        edges.iter().filter(|(_, to)| to.contains("cache")).map(|(m, _)| m).collect();
    // The flags build its CacheConfig; the services and the server use the facade; no part
    // of the data path does.
    assert_eq!(reaches_cache, ["config", "control", "server", "source"], "who sees the cache facade");
}

#[test]
fn a_cycle_is_found_and_named() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("fetch".to_owned(), ["cache".to_owned()].into()),
        ("cache".to_owned(), ["fetch".to_owned(), "index".to_owned()].into()),
    ]
    .into();
    assert_eq!(cycle(&edges).unwrap(), ["cache", "fetch", "cache"]);
    assert_eq!(
        referenced("use crate::{\n    Error,\n    cache::{Cache, CacheConfig},\n    fetch::X,\n};"),
        ["Error", "cache", "fetch"].map(String::from).into()
    );
}
