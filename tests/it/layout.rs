//! The layout the guide promises (docs/contributing.md, "Layout"): the top-level modules of
//! `src/` depend on each other one way (no cycle), and that Layout section names every
//! folder of `src/` and of the repository that holds code or SQL.
//!
//! Dependencies are read from the source text: a module `a` depends on `b` when a file
//! under `src/a` (or `src/a.rs`) names `crate::b` (in a path or a `use crate::{b, …}`
//! group). `lib.rs` and `bin/` sit above everything and are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The text without `//` comments (doc comments name modules in links, which is fine).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// Top-level module → the top-level modules it names.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files
        .iter()
        .map(|f| top_module(&src, f))
        .filter(|m| m != "lib" && m != "bin")
        .collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let from = top_module(&src, file);
        if from == "lib" || from == "bin" {
            continue;
        }
        let text = code(&fs::read_to_string(file).unwrap());
        let mut named = BTreeSet::new();
        for (i, _) in text.match_indices("crate::") {
            let rest = &text[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                // Only the first segment of each item of the group: `{a::x, b}`.
                for item in group.split(',') {
                    named.insert(ident_at(item.trim()).to_string());
                }
            } else {
                named.insert(ident_at(rest).to_string());
            }
        }
        let edges = graph.entry(from.clone()).or_default();
        for to in named {
            if to != from && modules.contains(&to) {
                edges.insert(to);
            }
        }
    }
    graph
}

fn top_module(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// A cycle through `start`, if any, as the list of modules on it.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        graph: &BTreeMap<String, BTreeSet<String>>,
        start: &str,
        at: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(at).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if walk(graph, start, next, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    let mut seen = BTreeSet::new();
    walk(graph, start, start, &mut path, &mut seen).then_some(path)
}

#[test]
fn top_level_modules_depend_one_way() {
    let graph = module_graph();
    assert!(
        graph.contains_key("store") && graph.contains_key("runner"),
        "the scan found no modules: {graph:?}"
    );
    let cycles: Vec<String> = graph
        .keys()
        .filter_map(|m| cycle_through(&graph, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules:\n{}\n(graph: {graph:#?})",
        cycles.join("\n")
    );
}

#[test]
fn the_flow_runs_from_the_cli_down_to_the_backends() {
    let graph = module_graph();
    let depends = |a: &str, b: &str| graph.get(a).is_some_and(|e| e.contains(b));
    // Lower layers never name the layers above them.
    let layers: &[(&str, &[&str])] = &[
        (
            "backend",
            &["store", "warehouse", "runner", "guard", "job", "cli"],
        ),
        ("store", &["warehouse", "runner", "guard", "job", "cli"]),
        ("warehouse", &["store", "runner", "guard", "job", "cli"]),
        ("guard", &["runner", "job", "cli", "warehouse"]),
        ("runner", &["job", "cli", "warehouse"]),
        ("job", &["cli"]),
        // The event gate stands beside the batch runs: it stops on the same cancellation
        // token (crate::cancel, below both), and names neither the runner nor jobs.
        ("events", &["runner", "job", "cli", "guard", "warehouse"]),
    ];
    for (module, above) in layers {
        for other in *above {
            assert!(
                !depends(module, other),
                "{module} names {other}, a layer above it (flow: cli → job → runner → guards → store → backend; warehouses beside stores)"
            );
        }
    }
}

/// The Layout section lives in the guide's contributing page (docs/contributing.md) since
/// the README became a front door (issue 24).
#[test]
fn guide_layout_names_every_folder() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = fs::read_to_string(root.join("docs/contributing.md")).unwrap();
    let layout = page
        .split("\n## Layout")
        .nth(1)
        .expect("docs/contributing.md has a `## Layout` section")
        .split("\n## ")
        .next()
        .unwrap();
    let mut folders = Vec::new();
    for entry in fs::read_dir(root.join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            folders.push(format!(
                "src/{}/",
                path.file_name().unwrap().to_string_lossy()
            ));
        }
    }
    for top in [
        "sql",
        "sql/migrations",
        "sql/reports",
        "tests",
        "benches",
        "jobs",
    ] {
        if root.join(top).is_dir() {
            folders.push(format!("{top}/"));
        }
    }
    let missing: Vec<&String> = folders
        .iter()
        .filter(|f| !layout.contains(f.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the Layout section of docs/contributing.md does not name {missing:?}"
    );
}

/// The project card fixes the top level: Cargo.toml, src, sql, jobs, tests, README.md
/// (docs, benches, examples, CI and a python/ member beside them). The SQL a user may read
/// or run lives under `sql/`, never in folders of its own at the top.
#[test]
fn the_top_level_is_the_cards() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let allowed = [
        "Cargo.toml",
        "Cargo.lock",
        "src",
        "sql",
        "jobs",
        "tests",
        "README.md",
        "docs",
        "benches",
        "examples",
        "python",
        // The image (issue 23): the Containerfile and what its build leaves out (read by
        // Docker and buildah alike).
        "Containerfile",
        ".dockerignore",
        ".ci",
        ".git",
        ".gitignore",
        "target",
    ];
    let mut extra = Vec::new();
    for entry in fs::read_dir(root).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        // The README demo's ledger (`./idem.db`, its WAL files) and the spool are a
        // user's files, ignored by git.
        let local = name.starts_with("idem.db") || name == ".idem-spool";
        if !allowed.contains(&name.as_str()) && !local {
            extra.push(name);
        }
    }
    assert!(extra.is_empty(), "not on the card's top level: {extra:?}");
    for dialect in ["sqlite", "postgres", "bigquery"] {
        for kind in ["migrations", "reports"] {
            assert!(
                root.join("sql").join(kind).join(dialect).is_dir(),
                "sql/{kind}/{dialect}/ is missing"
            );
        }
    }
    assert!(root.join("sql/README.md").is_file());
}

/// No file of `src/` passes 800 lines (issue 36): a bigger one is split by concern, its
/// tests in a `tests.rs` beside it.
#[test]
fn no_src_file_is_over_800_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut over = Vec::new();
    for file in files {
        let lines = fs::read_to_string(&file).unwrap().lines().count();
        if lines > 800 {
            over.push(format!("{}: {lines} lines", file.display()));
        }
    }
    assert!(
        over.is_empty(),
        "at most 800 lines a file (split by concern):\n{}",
        over.join("\n")
    );
}

/// One table maps a URL's scheme to a backend (`backend::Backend::named`); nothing outside
/// `src/backend/` matches a scheme itself (`starts_with("sqlite:…")`, a `"postgres" =>`
/// arm): it asks `Backend::of`, `Backend::named` or `Backend::sqlite_path`.
#[test]
fn nothing_outside_the_backend_table_matches_url_schemes() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let schemes = [
        "memory",
        "sqlite",
        "postgres",
        "postgresql",
        "bigquery",
        "redis",
        "rediss",
    ];
    let mut found = Vec::new();
    for file in files {
        if file.starts_with(src.join("backend")) {
            continue;
        }
        let text = code(&fs::read_to_string(&file).unwrap());
        for (n, line) in text.lines().enumerate() {
            let compact: String = line.split_whitespace().collect();
            // A store's kind (`store.kind()`) names its backend too; that is no URL.
            let matches = !compact.contains("kind()")
                && schemes.iter().any(|s| {
                    [
                        format!("starts_with(\"{s}:"),
                        format!("strip_prefix(\"{s}:"),
                        format!("\"{s}\"=>"),
                        format!("\"{s}\"|"),
                        format!("|\"{s}\""),
                    ]
                    .iter()
                    .any(|p| compact.contains(p.as_str()))
                });
            if matches {
                found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "URL schemes matched outside src/backend/ (use backend::Backend):\n{}",
        found.join("\n")
    );
}

/// No `static` of the library or the Python package is a lock a forked child could find
/// held (a `Mutex`, `RwLock`, `OnceLock`, `LazyLock`, `Once`…, or a struct holding one): a
/// lock another thread held at the instant of a `fork()` stays held in the child for good.
/// The Python package's forked children hung so on the SQLite statement texts kept
/// (`src/store/sqlite/event_sql.rs`, a struct around a `Mutex`). So every static's type is
/// one this test knows holds no such lock: a `per_process::PerProcess` (a forked child
/// gets its own value), an atomic, a plain value, pyo3's `GILOnceCell` (filled with the GIL
/// held, which the forking thread holds), or a type reviewed below. Test code (after
/// `#[cfg(test)]`) is left out.
#[test]
fn no_static_is_a_lock_a_forked_child_could_find_held() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    rust_files(&root.join("python/src"), &mut files);
    let plain = [
        "PerProcess",
        "GILOnceCell",
        "bool",
        "u8",
        "u16",
        "u32",
        "u64",
        "usize",
        "i32",
        "i64",
        "str",
    ];
    // Types that hold a lock, or look as if they might, reviewed one by one.
    let reviewed = [
        // Its list is published by compare-and-swap, not a `OnceLock`.
        "Dialect",
        // The static one (`TurnStarted::nobody`) holds no lock.
        "TurnStarted",
        // In `tokio::task_local!`: one run's, never the process's.
        "StoppingList",
    ];
    let mut found = Vec::new();
    for file in files {
        if file.ends_with("src/per_process.rs") {
            continue;
        }
        let text = code(&fs::read_to_string(&file).unwrap());
        let text = text.split("#[cfg(test)]").next().unwrap_or_default();
        for (at, _) in text.match_indices("static ") {
            let before = text[..at].chars().last().unwrap_or(' ');
            if before.is_ascii_alphanumeric() || before == '_' || before == '\'' {
                continue;
            }
            // The declared type: from the `:` after the name to the `=` or `;`.
            let rest = &text[at + "static ".len()..];
            let Some(colon) = rest.find(':') else {
                continue;
            };
            let end = rest[colon..]
                .find(['=', ';'])
                .map_or(rest.len(), |e| colon + e);
            let ty: String = rest[colon + 1..end].split_whitespace().collect();
            // The outer type's name: `[AtomicUsize;N]` → AtomicUsize, `crate::a::B<C>` → B.
            let outer = ty
                .trim_start_matches(['[', '&'])
                .trim_start_matches("'static");
            let outer = outer.split(['<', ';', ']']).next().unwrap_or_default();
            let outer = outer.rsplit("::").next().unwrap_or_default();
            if !(outer.starts_with("Atomic") || plain.contains(&outer) || reviewed.contains(&outer))
            {
                let line = text[..at].lines().count().max(1);
                found.push(format!(
                    "{}:{line}: static {}",
                    file.display(),
                    rest[..end].trim()
                ));
            }
        }
    }
    assert!(
        found.is_empty(),
        "a static a forked child could find locked (make it a per_process::PerProcess, or \
         review its type here):\n{}",
        found.join("\n")
    );
}
