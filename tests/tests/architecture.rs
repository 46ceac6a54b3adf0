//! The workspace's structure, read from its sources and its dependency tree, so that a
//! change that breaks it fails here, naming what broke:
//!
//! - no module of any crate reaches (through `use crate::...` or a `crate::` path) a
//!   module that reaches back to it; the spoke's data path does not see its facade;
//! - each crate takes only what its concern needs: the servers and the CLI none of the
//!   format readers' dependencies, the SDK no server stack.

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

/// The module each name a crate root re-exports comes from (`pub use server::PeerGroup;`,
/// `pub use self::{batch::{BATCH_BYTES, read_batched}, budget::Budget};`).
fn reexports(root: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut statements = Vec::new();
    for marker in ["\npub use ", "\npub(crate) use "] {
        let mut rest = root;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            statements.push(&rest[..rest.find(';').unwrap()]);
        }
    }
    for statement in statements {
        let statement = statement.trim().trim_start_matches("self::");
        let items = match statement.strip_prefix('{') {
            Some(group) => top_level_items(group.strip_suffix('}').unwrap()),
            None => vec![statement.to_owned()],
        };
        for item in items {
            let module = first_segment(&item);
            // Every name the item brings in: after `as`, or the identifiers after `::`.
            let names = item.split("::").skip(1).collect::<Vec<_>>().join("::");
            for name in names.split([',', '{', '}']).map(|n| n.rsplit(" as ").next().unwrap().trim()) {
                if !name.is_empty() && !name.contains("::") {
                    map.insert(name.to_owned(), module.clone());
                }
            }
        }
    }
    map
}

/// The items at the top level of a `{...}` group's inside, split at its commas.
fn top_level_items(group: &str) -> Vec<String> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(group[start..i].trim().to_owned());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(group[start..].trim().to_owned());
    items.retain(|i| !i.is_empty());
    items
}

/// The modules a crate root (`lib.rs`, `main.rs`) declares.
fn declared_modules(root: &str) -> BTreeSet<String> {
    root.lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            l.strip_prefix("mod ")
        })
        .filter(|m| m.ends_with(';'))
        .map(|m| m.trim_end_matches(';').to_owned())
        .collect()
}

/// Which of the root's modules each of them reaches (through `crate::` paths, directly
/// or through a name the root re-exports), read from the files under the root's folder.
fn module_graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root).unwrap();
    let modules = declared_modules(&text);
    let reexported = reexports(&text);
    let dir = root.parent().unwrap();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources(dir) {
        let relative = file.strip_prefix(dir).unwrap();
        let module = relative.iter().next().unwrap().to_string_lossy().trim_end_matches(".rs").to_owned();
        if !modules.contains(&module) || is_test_code(&file) {
            continue; // the root itself, another root's files (`bin/`), tests
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = without_tests(&text);
        let mut names = referenced(code);
        // In a module file at the root's level, `super::` is the crate root.
        if relative.components().count() == 1 {
            names.extend(referenced(&code.replace("super::", "crate::")));
        }
        for name in names {
            let target = if modules.contains(&name) { Some(&name) } else { reexported.get(&name) };
            if let Some(target) = target.filter(|t| **t != module) {
                edges.entry(module.clone()).or_default().insert(target.clone());
            }
        }
    }
    edges
}

/// Whether `file` holds only test code (`tests.rs`, the spoke's `testing.rs`): tests may
/// look anywhere.
fn is_test_code(file: &Path) -> bool {
    matches!(file.file_stem().and_then(|s| s.to_str()), Some("tests" | "testing"))
}

/// `text` without its unit tests (an inline `#[cfg(test)] mod tests { ... }` at the end
/// of a file; a `mod tests;` declaration is left, and its file skipped: `is_test_code`).
fn without_tests(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests {").next().unwrap()
}

/// The folder of every crate of the workspace (its `members`).
fn workspace_crates() -> Vec<PathBuf> {
    let workspace = shardcache_tests::workspace_dir();
    let manifest = std::fs::read_to_string(workspace.join("Cargo.toml")).unwrap();
    let members = manifest.lines().find_map(|l| l.strip_prefix("members = [")).unwrap();
    members.trim_end_matches(']').split(',').map(|m| workspace.join(m.trim().trim_matches('"'))).collect()
}

/// A crate's roots: its library, its binary and each binary under `src/bin/NAME/`.
fn crate_roots(dir: &Path) -> Vec<PathBuf> {
    let src = dir.join("src");
    let mut roots: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(|r| src.join(r)).filter(|r| r.exists()).collect();
    if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
        roots.extend(bins.flatten().map(|b| b.path().join("main.rs")).filter(|r| r.exists()));
    }
    roots
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
fn no_crate_has_modules_that_import_each_other() {
    let (mut graphs, mut cycles) = (0, Vec::new());
    for dir in workspace_crates() {
        for root in crate_roots(&dir) {
            let edges = module_graph(&root);
            graphs += usize::from(!edges.is_empty());
            if let Some(found) = cycle(&edges) {
                cycles.push(format!("{}: {}", root.display(), found.join(" -> ")));
            }
        }
    }
    assert!(graphs >= 8, "the crates' graphs were read: {graphs}");
    // Edges known to exist, one per way a path is written, so that a parser that stops
    // seeing them fails here rather than passing an empty graph.
    let workspace = shardcache_tests::workspace_dir();
    let formats = module_graph(&workspace.join("formats/src/lib.rs"));
    assert!(
        formats["decoded"].contains("mds") && formats["decoded"].contains("budget"),
        "super:: at the root: {formats:?}"
    );
    let client = module_graph(&workspace.join("client/src/lib.rs"));
    assert!(client["stream"].contains("verify") && client["client"].contains("discovery"), "{client:?}");
    assert!(cycles.is_empty(), "modules that import each other:\n{}", cycles.join("\n"));
}

#[test]
fn the_spokes_modules_import_each_other_one_way() {
    let edges = module_graph(&shardcache_tests::workspace_dir().join("spoke-cache/src/lib.rs"));
    assert!(edges.get("cache").is_some_and(|e| e.contains("fetch")), "the graph was read: {edges:?}");
    assert_eq!(cycle(&edges), None, "modules that import each other");
    let reaches_cache: Vec<&String> =
        edges.iter().filter(|(_, to)| to.contains("cache")).map(|(m, _)| m).collect();
    // The front doors (the services, the flags, the server) use the facade; no part of the
    // data path does.
    assert_eq!(reaches_cache, ["serve"], "who sees the cache facade");
}

/// The spoke's files as nodes (module paths: `fetch::upstream`), each reaching the files
/// its code names: `crate::a::b::X` the deepest of `a`, `a/b` that is a file, `super::X`
/// its parent (or the sibling `X`), `self::x` its child. Test code is left out (a
/// `#[cfg(test)]` module at a file's end, `tests.rs`, `testing.rs`): tests may look
/// anywhere.
fn file_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let module_of = |file: &Path| -> String {
        let relative = file.strip_prefix(src).unwrap().with_extension("");
        let parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
        let parts =
            if parts.last().is_some_and(|p| p == "mod") { &parts[..parts.len() - 1] } else { &parts[..] };
        parts.join("::")
    };
    let files: Vec<PathBuf> = sources(src)
        .into_iter()
        .filter(|f| {
            !matches!(f.file_stem().and_then(|s| s.to_str()), Some("tests" | "testing" | "lib" | "main"))
        })
        .collect();
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(f)).collect();
    let reexported = reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap());
    // The deepest module of `path` (segments) that is a file.
    let deepest = |path: &[String]| -> Option<String> {
        (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| modules.contains(m))
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = module_of(file);
        let text = std::fs::read_to_string(file).unwrap();
        let code: String = without_tests(&text)
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let own: Vec<String> = module.split("::").map(str::to_owned).collect();
        let mut reached = BTreeSet::new();
        for (prefix, base) in
            [("crate::", Vec::new()), ("super::", own[..own.len() - 1].to_vec()), ("self::", own.clone())]
        {
            let mut rest = code.as_str();
            while let Some(at) = rest.find(prefix) {
                // `crate::` inside a longer name or path is no path of its own.
                let before = rest[..at].chars().last();
                rest = &rest[at + prefix.len()..];
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                    continue;
                }
                // `super::super::`: one level up per `super`.
                let mut base = base.clone();
                while let Some(up) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = up;
                }
                let items = match rest.strip_prefix('{') {
                    Some(group) => top_level_items(&group[..group.find("};").unwrap_or(group.len())]),
                    None => vec![
                        rest.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                            .next()
                            .unwrap()
                            .to_owned(),
                    ],
                };
                for item in items {
                    let mut path = base.clone();
                    path.extend(item.split("::").map(first_segment).filter(|p| !p.is_empty()));
                    // A name the crate root re-exports (`crate::Error`) is its module's.
                    if prefix == "crate::"
                        && let Some(module) = path.first().and_then(|name| reexported.get(name))
                    {
                        path[0] = module.clone();
                    }
                    reached.extend(deepest(&path));
                }
            }
        }
        reached.remove(&module);
        edges.insert(module, reached);
    }
    edges
}

#[test]
fn the_spokes_files_never_call_back_into_their_caller() {
    let src = shardcache_tests::workspace_dir().join("spoke-cache/src");
    let edges = file_graph(&src);
    for (from, to) in [
        ("read::path", "fetch"),
        ("fetch::speculation", "fetch::upstream"),
        ("fetch", "store::admission"),
        ("fetch::upstream", "error"),
        ("fetch::upstream", "fetch::suppliers"),
        ("read::path", "store::catalog"),
    ] {
        assert!(edges[from].contains(to), "{from} reaches {to}: the graph was read: {:?}", edges[from]);
    }
    assert_eq!(cycle(&edges), None, "files that reach each other: a cold read would enter one twice");
    // The facade's parts never reach the facade.
    for part in [
        "read::cold_open",
        "read::path",
        "read::ahead",
        "fetch",
        "fetch::lookup",
        "store::admission",
        "fetch::suppliers",
    ] {
        assert!(!edges[part].contains("cache"), "{part} reaches the cache's facade: {:?}", edges[part]);
    }
}

/// The spoke's top-level folders (and files), highest first: each may import only those
/// below it (and itself). `lib.rs` draws the same picture.
const SPOKE_LAYERS: [&str; 10] =
    ["serve", "cache", "read", "plans", "fetch", "store", "policy", "observe", "error", "testing"];

#[test]
fn the_spokes_folders_import_only_those_below_them() {
    let src = shardcache_tests::workspace_dir().join("spoke-cache/src");
    // Every top-level entry has its place, so a new one must be given one here.
    let mut entries: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().trim_end_matches(".rs").to_owned())
        .filter(|name| name != "lib" && name != "main")
        .collect();
    entries.sort();
    let mut layers = SPOKE_LAYERS.map(str::to_owned).to_vec();
    layers.sort();
    assert_eq!(entries, layers, "the spoke's top level: at most 10 entries, each in SPOKE_LAYERS");
    let rank = |module: &str| SPOKE_LAYERS.iter().position(|l| *l == module.split("::").next().unwrap());
    let edges = file_graph(&src);
    assert!(edges["read::path"].contains("plans"), "the graph was read: {:?}", edges["read::path"]);
    let mut upward = Vec::new();
    for (from, to) in &edges {
        for target in to {
            if rank(target) < rank(from) {
                upward.push(format!("{from} -> {target}"));
            }
        }
    }
    assert!(upward.is_empty(), "imports up the layers {SPOKE_LAYERS:?}:\n{}", upward.join("\n"));
    // Each folder's header says what it owns and what it may import.
    for folder in SPOKE_LAYERS.iter().filter(|l| src.join(l).is_dir()) {
        let header = std::fs::read_to_string(src.join(folder).join("mod.rs")).unwrap();
        assert!(header.contains("Owns:") && header.contains("May import"), "{folder}/mod.rs's header");
    }
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
    let root = "mod a;\npub mod b;\npub use self::{\n    a::{X, y as Z},\n    b::W,\n};\npub use b::V;\n";
    assert_eq!(declared_modules(root), ["a", "b"].map(String::from).into());
    let names: Vec<(String, String)> = reexports(root).into_iter().collect();
    assert_eq!(
        names,
        [("V", "b"), ("W", "b"), ("X", "a"), ("Z", "a")].map(|(n, m)| (n.to_owned(), m.to_owned()))
    );
}

/// The packages `package` depends on to build and run (normal and build edges, with the
/// features this package alone enables), as `name` -> features: `cargo tree`, offline.
fn dependencies(package: &str) -> BTreeMap<String, BTreeSet<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let workspace = shardcache_tests::workspace_dir();
    let out = std::process::Command::new(cargo)
        .args(["tree", "--offline", "-p", package, "-e", "normal,build", "--prefix", "none", "-f", "{p} {f}"])
        .current_dir(workspace)
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&out.stderr));
    let mut packages: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let mut words = line.split_whitespace();
        let name = words.next().unwrap().to_owned();
        let _version = words.next();
        let features = words.find(|w| !w.starts_with('(')).unwrap_or_default();
        packages
            .entry(name)
            .or_default()
            .extend(features.split(',').filter(|f| !f.is_empty()).map(str::to_owned));
    }
    packages
}

#[test]
fn each_crate_takes_only_what_its_concern_needs() {
    // The format readers' own dependencies: those `formats/Cargo.toml` names itself rather
    // than taking from the workspace (the decoders: parquet, ruzstd, flate2, snap).
    let manifest = shardcache_tests::workspace_dir().join("formats/Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).unwrap();
    let section = manifest.split("[dependencies]").nth(1).unwrap().split("\n[").next().unwrap();
    let readers: Vec<&str> = section
        .lines()
        .filter(|l| !l.starts_with('#') && l.contains('=') && !l.contains("workspace"))
        .map(|l| l.split([' ', '=']).next().unwrap())
        .collect();
    assert!(readers.contains(&"parquet") && readers.contains(&"ruzstd"), "{readers:?}");
    for package in ["spoke-cache", "hub-server", "shardcache-cli", "shardcache-reader", "shardcache-serving"]
    {
        let tree = dependencies(package);
        let taken: Vec<&&str> = readers.iter().filter(|p| tree.contains_key(**p)).collect();
        assert!(taken.is_empty(), "{package} builds the format readers' dependencies {taken:?}");
    }
    // The SDK (and the Python wheel built from it) carries no server stack.
    for package in ["shardcache-client", "shardcache-formats", "shardcache-python"] {
        let tree = dependencies(package);
        for server in ["shardcache-serving", "tonic-reflection", "axum", "clap", "rocksdb"] {
            assert!(!tree.contains_key(server), "{package} depends on {server}");
        }
        let hyper = tree.get("hyper").unwrap_or_else(|| panic!("{package} talks HTTP/2 through hyper"));
        assert!(!hyper.contains("server"), "{package} builds hyper's server: {hyper:?}");
        assert!(!tree["tonic"].contains("server"), "{package} builds tonic's server: {:?}", tree["tonic"]);
    }
}

/// The relative links (`[text](path)` or `[text](path#anchor)`) of a markdown page.
fn relative_links(page: &str) -> Vec<&str> {
    page.match_indices("](")
        .filter_map(|(at, _)| page[at + 2..].split(')').next())
        .filter(|link| !link.starts_with("http") && !link.starts_with('#') && !link.contains(' '))
        .collect()
}

#[test]
fn the_readme_is_a_newcomers_page_that_links_every_doc() {
    let workspace = shardcache_tests::workspace_dir();
    let readme = std::fs::read_to_string(workspace.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 250,
        "the README has {} lines: the manual is docs/",
        readme.lines().count()
    );
    let mut pages: Vec<PathBuf> =
        std::fs::read_dir(workspace.join("docs")).unwrap().flatten().map(|e| e.path()).collect();
    pages.sort();
    assert!(pages.len() >= 6, "{pages:?}");
    for page in &pages {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(readme.contains(&format!("]({name})")), "the README does not link {name}");
    }
    // Every relative link of the README and the docs names a file that is there.
    for page in pages.iter().chain([&workspace.join("README.md")]) {
        let text = std::fs::read_to_string(page).unwrap();
        for link in relative_links(&text) {
            let target = page.parent().unwrap().join(link.split('#').next().unwrap());
            assert!(target.exists(), "{}: the link {link} names nothing", page.display());
        }
    }
    assert_eq!(relative_links("see [a](docs/a.md#x), [b](https://b) and [c](#c)"), ["docs/a.md#x"]);
}
