//! Tidy checks: rules of the repository that a test can hold, run by `cargo test --workspace`
//! (xtask is a workspace member), as rust-analyzer's `xtask/src/tidy.rs` holds its own.
//!
//! ARCHITECTURE.md's dependency table names, for every workspace crate, the workspace crates its
//! `[dependencies]` name (dev- and build-dependencies aside). The manifests are read through
//! `cargo metadata`, so workspace inheritance (`zdevice.workspace = true`) counts as written.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use crate::toolchain::{self, workspace_root};

/// Crate name -> the workspace crates it depends on.
type Deps = BTreeMap<String, BTreeSet<String>>;

/// The header row of ARCHITECTURE.md's dependency table.
const TABLE_HEADER: &str = "| crate | depends on |";

/// Each workspace crate's normal dependencies on other workspace crates, from the manifests,
/// and the manifest path of each crate (relative to the workspace root) for the messages.
fn manifest_deps() -> (Deps, BTreeMap<String, String>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = toolchain::output(
        Command::new(cargo)
            .args([
                "metadata",
                "--format-version",
                "1",
                "--no-deps",
                "--offline",
            ])
            .current_dir(workspace_root()),
    )
    .expect("cargo metadata runs");
    let meta: serde_json::Value = serde_json::from_str(&out).expect("cargo metadata is JSON");
    let packages = meta["packages"].as_array().expect("a package list");
    let members: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    let root = workspace_root();
    let mut deps = Deps::new();
    let mut manifests = BTreeMap::new();
    for p in packages {
        let name = p["name"].as_str().expect("a package name").to_string();
        let manifest = p["manifest_path"].as_str().unwrap_or_default();
        let shown = std::path::Path::new(manifest)
            .strip_prefix(&root)
            .map_or_else(|_| manifest.to_string(), |p| p.display().to_string());
        manifests.insert(name.clone(), shown);
        let normal = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| members.contains(*d) && *d != name)
            .map(str::to_string)
            .collect();
        deps.insert(name, normal);
    }
    (deps, manifests)
}

/// The `code` spans of a table cell, in order.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

/// The dependency table of ARCHITECTURE.md: rows `| `crate` | `dep`, `dep` |` after
/// [`TABLE_HEADER`] and its separator, up to the first line that is not a row.
fn documented_deps(doc: &str) -> Result<Deps, String> {
    let mut lines = doc.lines().skip_while(|l| l.trim() != TABLE_HEADER).skip(1);
    match lines.next() {
        Some(sep) if sep.starts_with("|---") => {}
        _ => {
            return Err(format!(
                "ARCHITECTURE.md has no dependency table (a `{TABLE_HEADER}` header and its `|---|---|` row)"
            ));
        }
    }
    let mut deps = Deps::new();
    for row in lines.take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').collect();
        let [krate, on] = cells[..] else {
            return Err(format!(
                "ARCHITECTURE.md's dependency table: `{row}` is not `| crate | depends on |`"
            ));
        };
        let Some(name) = code_spans(krate).into_iter().next() else {
            return Err(format!(
                "ARCHITECTURE.md's dependency table: `{row}` names no crate in backticks"
            ));
        };
        if deps
            .insert(name.clone(), code_spans(on).into_iter().collect())
            .is_some()
        {
            return Err(format!(
                "ARCHITECTURE.md's dependency table lists `{name}` twice"
            ));
        }
    }
    Ok(deps)
}

/// Every difference between the table and the manifests, one sentence each.
fn mismatches(doc: &Deps, manifests: &Deps, paths: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let path = |c: &str| paths.get(c).cloned().unwrap_or_else(|| c.to_string());
    for (krate, real) in manifests {
        let Some(listed) = doc.get(krate) else {
            out.push(format!(
                "`{krate}` ({}) has no row in ARCHITECTURE.md's dependency table",
                path(krate)
            ));
            continue;
        };
        for d in real.difference(listed) {
            out.push(format!(
                "`{krate}` depends on `{d}` ({}) but ARCHITECTURE.md's dependency table does not list it",
                path(krate)
            ));
        }
        for d in listed.difference(real) {
            out.push(format!(
                "ARCHITECTURE.md's dependency table says `{krate}` depends on `{d}`, but {} does not name it in [dependencies]",
                path(krate)
            ));
        }
    }
    for krate in doc.keys().filter(|k| !manifests.contains_key(*k)) {
        out.push(format!(
            "ARCHITECTURE.md's dependency table lists `{krate}`, which is no workspace crate"
        ));
    }
    out
}

#[test]
fn architecture_md_lists_every_crates_dependencies() {
    let path = workspace_root().join("ARCHITECTURE.md");
    let text = std::fs::read_to_string(&path).expect("ARCHITECTURE.md reads");
    let doc = documented_deps(&text).unwrap_or_else(|e| panic!("{e}"));
    let (real, paths) = manifest_deps();
    let wrong = mismatches(&doc, &real, &paths);
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md's dependency table and the manifests disagree (update the table, or \
         the manifest if the dependency is the mistake):\n- {}",
        wrong.join("\n- ")
    );
}

#[test]
fn each_kind_of_mismatch_is_named() {
    let doc = documented_deps(
        "x\n| crate | depends on |\n|---|---|\n| `a` | `b`, `c` |\n| `b` (`lib/`) | |\n| `gone` | `a` |\nafter\n",
    )
    .unwrap();
    assert_eq!(doc["a"], BTreeSet::from(["b".into(), "c".into()]));
    assert!(doc["b"].is_empty());
    let real = Deps::from([
        ("a".into(), BTreeSet::from(["b".into(), "d".into()])),
        ("b".into(), BTreeSet::new()),
        ("e".into(), BTreeSet::new()),
    ]);
    let paths = BTreeMap::from([("a".to_string(), "crates/a/Cargo.toml".to_string())]);
    let wrong = mismatches(&doc, &real, &paths);
    assert_eq!(
        wrong,
        [
            "`a` depends on `d` (crates/a/Cargo.toml) but ARCHITECTURE.md's dependency table does not list it",
            "ARCHITECTURE.md's dependency table says `a` depends on `c`, but crates/a/Cargo.toml does not name it in [dependencies]",
            "`e` (e) has no row in ARCHITECTURE.md's dependency table",
            "ARCHITECTURE.md's dependency table lists `gone`, which is no workspace crate",
        ]
    );
    assert!(mismatches(&doc, &doc, &paths).is_empty());
}

#[test]
fn a_missing_or_malformed_table_is_an_error() {
    assert!(documented_deps("no table here").is_err());
    assert!(documented_deps("| crate | depends on |\nnot a separator\n").is_err());
    assert!(documented_deps("| crate | depends on |\n|---|---|\n| a | b |\n").is_err());
    assert!(documented_deps("| crate | depends on |\n|---|---|\n| `a` | |\n| `a` | |\n").is_err());
}
