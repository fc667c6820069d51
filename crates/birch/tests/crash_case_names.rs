//! Every crash case a design doc names has a test of the same name
//! (docs/ARCHITECTURE.md: each subsystem's doc lists its crash cases as
//! command sequences, and each becomes a test). A case is a list item that
//! begins with a name in backquotes (`` - `power_cut_during_x`: ... ``)
//! inside a section whose heading says "Crash cases"; a test is any `fn`
//! of that name in the workspace's sources or tests.

mod source_scan;

use source_scan::{read_crate, tokens};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root")
}

/// The crash case names a doc's "Crash cases" sections list, with the line
/// each is on.
fn crash_cases(doc: &str) -> Vec<(String, usize)> {
    let mut cases = Vec::new();
    // The heading level of the crash-case section we are in, if any.
    let mut section: Option<usize> = None;
    for (at, line) in doc.lines().enumerate() {
        if let Some(heading) = line.strip_prefix('#') {
            let level = 1 + heading.chars().take_while(|&c| c == '#').count();
            let title = heading.trim_start_matches('#').to_ascii_lowercase();
            if title.contains("crash case") {
                section = Some(level);
            } else if section.is_some_and(|open| level <= open) {
                section = None;
            }
            continue;
        }
        if section.is_none() {
            continue;
        }
        let item = line.trim_start();
        let Some(rest) = item.strip_prefix("- ").or_else(|| item.strip_prefix("* ")) else {
            continue;
        };
        let Some(name) = rest
            .trim_start_matches('*')
            .strip_prefix('`')
            .and_then(|r| r.split_once('`'))
            .map(|(name, _)| name)
        else {
            continue;
        };
        let is_name = name.starts_with(|c: char| c.is_ascii_lowercase())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && name.contains('_');
        if is_name {
            cases.push((name.to_string(), at + 1));
        }
    }
    cases
}

/// Names of every `fn` in the workspace's crates (sources and tests).
fn function_names(root: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let crates = std::fs::read_dir(root.join("crates")).expect("crates/");
    for krate in crates {
        let krate = krate.expect("a crates/ entry").path();
        for dir in ["src", "tests"] {
            let dir = krate.join(dir);
            if !dir.is_dir() {
                continue;
            }
            for file in read_crate(&dir) {
                let toks = tokens(&file.code);
                for pair in toks.windows(2) {
                    if pair[0].text == "fn" {
                        names.insert(pair[1].text.clone());
                    }
                }
            }
        }
    }
    names
}

#[test]
fn every_crash_case_in_the_docs_has_a_test_of_its_name() {
    let root = workspace();
    let functions = function_names(&root);
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    let mut listed = 0;
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(doc).expect("a readable doc");
        for (name, line) in crash_cases(&text) {
            listed += 1;
            if !functions.contains(&name) {
                let rel = doc.strip_prefix(&root).unwrap_or(doc);
                missing.push(format!("{}:{line}: {name}", rel.display()));
            }
        }
    }
    // The docs list about a hundred cases: a reader that finds few has
    // stopped recognising them, and would pass for the wrong reason.
    assert!(listed >= 80, "only {listed} crash cases found in docs/");
    assert!(
        missing.is_empty(),
        "crash cases without a test of the same name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn crash_cases_are_read_from_their_sections_only() {
    let doc = "\
# X
- `not_a_case`: outside
## Crash cases
- `first_case`: `a; b; <cut>` → a
  - `nested_case`: indented
* **`bold_case`**: b
- `NotSnake`: ignored
- plain text
### Details
- `still_in_section`: deeper heading
## Next
- `after_section`: no
";
    let names: Vec<String> = crash_cases(doc).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["first_case", "nested_case", "bold_case", "still_in_section"]
    );
}
