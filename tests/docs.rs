//! Every command the README and the guide (`docs/`) show, run as shown (issue 24, item 4).
//!
//! [`trycmd`] runs each ```` ```console ```` block of `README.md` and `docs/*.md`: a
//! `$ idem ...` line is a command, the lines under it its expected output (stdout and
//! stderr), `? N` its exit code (0 when absent); `[..]` in a line matches any text (run
//! ids, times, durations) and `...` alone on a line any lines. The commands of one page
//! run in order in one sandbox: a fresh temporary folder holding a copy of `jobs/`,
//! `examples/jobs/` and the page's fixtures from `tests/docs/<page>/`, so the repository
//! never gets an `idem.db`. Blocks tagged `sh`, `toml`, `text`, … are not run (the guide
//! keeps them for what needs a service, cargo itself, or a shell); a fence with no tag
//! would be read as a console block, so every fence carries one.
//!
//! A page may show `cargo run -- ARGS` (build, then run `target/debug/idem ARGS` in the
//! current folder): [`cargo_run_lines_are_tested`] requires the same `$ idem ARGS` in a
//! console block of that page, so what `cargo run` prints is tested there.
//!
//! To see a failure's output in full: `cargo test --test docs`.

use std::fs;
use std::path::{Path, PathBuf};

/// The pages whose console blocks run: the README and every page of the guide.
fn pages(root: &Path) -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md")];
    let mut guide: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(root).unwrap().to_path_buf())
        .collect();
    guide.sort();
    pages.extend(guide);
    pages
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        // The demo's warehouse (jobs/demo.db) and a ledger left by hand are not inputs.
        if name_str.contains(".db") || name_str == ".idem-spool" {
            continue;
        }
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else {
            fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

/// trycmd turns every backslash of a command's output into `/` (path separators) before it
/// compares, but not the page's expected text: the staged copy of a page gets the same, in
/// the output lines of its console blocks only (the pages show the real backslashes, e.g.
/// the line continuations of an export).
fn normalize_backslashes(text: &str) -> String {
    let mut out = String::new();
    let mut in_console = false;
    for line in text.split_inclusive('\n') {
        if line.starts_with("```") {
            in_console = !in_console && line.trim_end() == "```console";
            out.push_str(line);
        } else if in_console && !line.starts_with("$ ") && !line.starts_with("> ") {
            out.push_str(&line.replace('\\', "/"));
        } else {
            out.push_str(line);
        }
    }
    out
}

/// The fenced blocks of a Markdown page: (indented, info string, lines).
fn blocks(text: &str) -> Vec<(bool, String, Vec<String>)> {
    let mut out = Vec::new();
    let mut current: Option<(bool, String, String, Vec<String>)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let fence = "```".to_string()
                        + &info.chars().take_while(|c| *c == '`').collect::<String>();
                    current = Some((
                        trimmed.len() != line.len(),
                        info.trim_start_matches('`').trim().to_string(),
                        fence,
                        Vec::new(),
                    ));
                }
            }
            Some((indent, info, fence, lines)) => {
                if trimmed.starts_with(fence.as_str()) {
                    out.push((*indent, std::mem::take(info), std::mem::take(lines)));
                    current = None;
                } else {
                    lines.push(line.to_string());
                }
            }
        }
    }
    out
}

#[test]
fn readme_and_guide_console_blocks() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The commands see the defaults the pages describe, not the developer's settings.
    for (key, _) in std::env::vars() {
        if (key.starts_with("IDEM_") && !key.starts_with("IDEM_TEST_")) || key == "RUST_LOG" {
            std::env::remove_var(key);
        }
    }
    let stage = std::env::temp_dir().join(format!("idem-docs-{}", std::process::id()));
    let _ = fs::remove_dir_all(&stage);
    let cases = trycmd::TestCases::new();
    cases
        .register_bin("idem", PathBuf::from(env!("CARGO_BIN_EXE_idem")))
        .timeout(std::time::Duration::from_secs(120));
    // `$ cat FILE` shows a file a command wrote (a report, a metrics file, CSV verdicts).
    let cat = ["/bin/cat", "/usr/bin/cat"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("cat");
    cases.register_bin("cat", PathBuf::from(cat));
    // The example processor's binary (`cargo run --example player_game_summary -- ...`):
    // `cargo test` builds examples before it runs the tests.
    let example = Path::new(env!("CARGO_BIN_EXE_idem"))
        .parent()
        .unwrap()
        .join("examples/player_game_summary");
    cases.register_bin("player_game_summary", example.clone());
    let mut needs_example = false;
    for page in pages(root) {
        let text = fs::read_to_string(root.join(&page)).unwrap();
        needs_example |= text.contains("$ player_game_summary");
        let staged = stage.join(&page);
        fs::create_dir_all(staged.parent().unwrap()).unwrap();
        fs::write(&staged, normalize_backslashes(&text)).unwrap();
        let sandbox = staged.with_extension("in");
        copy_dir(&root.join("jobs"), &sandbox.join("jobs"));
        copy_dir(&root.join("examples/jobs"), &sandbox.join("examples/jobs"));
        let stem = page.file_stem().unwrap();
        let fixtures = root.join("tests/docs").join(stem);
        if fixtures.is_dir() {
            copy_dir(&fixtures, &sandbox);
        }
        // An `.out` folder makes trycmd copy `.in` to a fresh temporary folder per page
        // and run the page's commands there (nothing in it is compared).
        fs::create_dir_all(staged.with_extension("out")).unwrap();
        cases.case(&staged);
    }
    assert!(
        !needs_example || example.is_file(),
        "{} is missing: `cargo test` builds it, or `cargo build --example player_game_summary`",
        example.display()
    );
    // Runs the cases now (and panics naming each failing page and line). A failed run
    // leaves the staged copies for a look; their line numbers are the pages' own.
    eprintln!("docs: pages staged in {}", stage.display());
    cases.run();
    drop(cases);
    let _ = fs::remove_dir_all(&stage);
}

/// `cargo run -- ARGS` on a page is `idem ARGS` in the current folder: the same command
/// must be in one of the page's console blocks, where its output is tested.
#[test]
fn cargo_run_lines_are_tested() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut untested = Vec::new();
    let mut fences_without_tag = Vec::new();
    let mut indented_console = Vec::new();
    let mut inline_fences = Vec::new();
    for page in pages(root) {
        let text = fs::read_to_string(root.join(&page)).unwrap();
        let blocks = blocks(&text);
        // A line that starts with backticks is a fence to trycmd: inline code there
        // (```` ```console ````) would open a block that swallows the rest of the page.
        for line in text.lines() {
            let rest = line.trim_start_matches('`');
            if line.len() - rest.len() >= 3 && rest.contains("```") {
                inline_fences.push(format!("{}: {line}", page.display()));
            }
        }
        let console: Vec<String> = blocks
            .iter()
            .filter(|(_, info, _)| info == "console")
            .flat_map(|(_, _, lines)| lines.iter())
            .filter_map(|l| l.strip_prefix("$ "))
            .map(|l| l.trim().to_string())
            .collect();
        for (indent, info, lines) in &blocks {
            // trycmd reads only fences at the start of a line: an indented console block
            // (inside a list item) would silently not run.
            if *indent && (info == "console" || info == "trycmd") {
                indented_console.push(format!("{}: {:?}", page.display(), lines.first()));
            }
            if info.is_empty() {
                fences_without_tag.push(format!("{}: {:?}", page.display(), lines.first()));
            }
            if info != "sh" {
                continue;
            }
            for line in lines {
                let line = line.split(" #").next().unwrap().trim();
                let shown = if let Some(args) = line.strip_prefix("cargo run -- ") {
                    format!("idem {args}")
                } else if let Some(rest) = line.strip_prefix("cargo run --example ") {
                    let (name, args) = rest.split_once(" -- ").unwrap_or((rest, ""));
                    format!("{name} {args}")
                } else {
                    continue;
                };
                if !console.contains(&shown) {
                    untested.push(format!("{}: `{line}` (no `$ {shown}`)", page.display()));
                }
            }
        }
    }
    assert!(
        untested.is_empty(),
        "cargo run lines without their tested console command: {untested:#?}"
    );
    assert!(
        fences_without_tag.is_empty(),
        "fences without a tag (trycmd would run them): {fences_without_tag:#?}"
    );
    assert!(
        inline_fences.is_empty(),
        "lines starting with inline code that trycmd reads as a fence: {inline_fences:#?}"
    );
    assert!(
        indented_console.is_empty(),
        "indented console blocks (trycmd would not run them): {indented_console:#?}"
    );
}
