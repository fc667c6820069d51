//! The engine's modules form layers that import only downward
//! (docs/ARCHITECTURE.md, "Layers"):
//!
//! ```text
//! format → error, device → btree, alloc → fs → check, print, scrub
//! ```
//!
//! and no files import each other in a cycle. These tests read the source,
//! so the rule holds without a reviewer. `cargo test -p birch --test layers
//! -- --nocapture` prints every edge.

mod source_scan;

use source_scan::{edges, read_crate, Edge, SourceFile};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module's layer; a file may import its own layer and the
/// ones below it.
const LAYERS: &[(&str, u32)] = &[
    ("format", 0),
    ("lock_order", 0),
    ("error", 1),
    ("device", 1),
    ("btree", 2),
    ("alloc", 2),
    ("fs", 3),
    ("check", 4),
    ("print", 4),
    ("scrub", 4),
];

fn crate_files() -> Vec<SourceFile> {
    read_crate(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

/// The top-level module a file belongs to (`fs/inode.rs` → `fs`); lib.rs
/// is the crate root, above every layer.
fn top_module(rel: &str) -> Option<&str> {
    let first = rel.split('/').next()?;
    let name = first.trim_end_matches(".rs");
    (name != "lib").then_some(name)
}

fn layer(module: &str) -> u32 {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, l)| *l)
        .unwrap_or_else(|| {
            panic!("module `{module}` has no layer: add it to LAYERS in tests/layers.rs and docs/ARCHITECTURE.md")
        })
}

fn describe(e: &Edge) -> String {
    format!("{}:{} uses {} ({})", e.from, e.line, e.to, e.path)
}

/// Edges from a lower layer to a higher one.
fn upward_edges(edges: &[Edge]) -> Vec<String> {
    edges
        .iter()
        .filter_map(|e| {
            let (from, to) = (top_module(&e.from)?, top_module(&e.to)?);
            (layer(from) < layer(to)).then(|| {
                format!(
                    "{} (layer {} `{from}` imports layer {} `{to}`)",
                    describe(e),
                    layer(from),
                    layer(to)
                )
            })
        })
        .collect()
}

/// One cycle in `graph` (nodes → the edges leaving them), as its edges, if
/// there is one.
fn find_cycle(graph: &BTreeMap<String, Vec<&Edge>>) -> Option<Vec<Edge>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit<'a>(
        node: &str,
        graph: &BTreeMap<String, Vec<&'a Edge>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<&'a Edge>,
    ) -> Option<Vec<Edge>> {
        marks.insert(node.to_string(), Mark::Open);
        for &e in graph.get(node).into_iter().flatten() {
            stack.push(e);
            match marks.get(&e.to) {
                Some(Mark::Open) => {
                    let start = stack.iter().position(|s| s.from == e.to).expect("on stack");
                    return Some(stack[start..].iter().map(|&e| e.clone()).collect());
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(&e.to, graph, marks, stack) {
                        return Some(cycle);
                    }
                }
            }
            stack.pop();
        }
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node) {
            if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(cycle);
            }
        }
    }
    None
}

/// Edges between top-level modules, one per (from, to) pair, named by the
/// first file edge that makes it.
fn module_graph(edges: &[Edge]) -> Vec<Edge> {
    let mut seen = BTreeSet::new();
    edges
        .iter()
        .filter_map(|e| {
            let (from, to) = (top_module(&e.from)?, top_module(&e.to)?);
            (from != to && seen.insert((from, to))).then(|| Edge {
                from: from.to_string(),
                to: to.to_string(),
                line: e.line,
                path: describe(e),
            })
        })
        .collect()
}

/// Directories whose `mod.rs` takes part in the sibling rule: it declares
/// and re-exports its children, so a child using anything the parent
/// defines makes a cycle; their shared types live in children of their own.
const MOD_RS_CHECKED: &[&str] = &["fs"];

/// Edges between sibling files of one directory module, leaving out its
/// `mod.rs` (except in [`MOD_RS_CHECKED`]): a parent declares and
/// re-exports its children, and a child uses the parent's shared types;
/// what must not happen is two children needing each other.
fn sibling_edges(edges: &[Edge]) -> Vec<Edge> {
    let dir = |rel: &str| rel.rsplit_once('/').map(|(d, _)| d.to_string());
    let exempt = |rel: &str| {
        rel.ends_with("/mod.rs") && !dir(rel).is_some_and(|d| MOD_RS_CHECKED.contains(&d.as_str()))
    };
    edges
        .iter()
        .filter(|e| {
            dir(&e.from).is_some()
                && dir(&e.from) == dir(&e.to)
                && !exempt(&e.from)
                && !exempt(&e.to)
        })
        .cloned()
        .collect()
}

fn graph_of(edges: &[Edge]) -> BTreeMap<String, Vec<&Edge>> {
    let mut graph: BTreeMap<String, Vec<&Edge>> = BTreeMap::new();
    for e in edges {
        graph.entry(e.from.clone()).or_default().push(e);
    }
    graph
}

fn cycle_message(what: &str, cycle: &[Edge]) -> String {
    let lines: Vec<String> = cycle
        .iter()
        .map(|e| format!("  {} → {}: {}", e.from, e.to, e.path))
        .collect();
    format!("import cycle among {what}:\n{}", lines.join("\n"))
}

#[test]
fn no_module_imports_a_higher_layer() {
    let files = crate_files();
    let edges = edges(&files);
    for e in module_graph(&edges) {
        println!("{} → {}: {}", e.from, e.to, e.path);
    }
    let upward = upward_edges(&edges);
    assert!(
        upward.is_empty(),
        "upward imports (the layers are {LAYERS:?}):\n{}",
        upward.join("\n")
    );
}

#[test]
fn top_level_modules_have_no_import_cycle() {
    let modules = module_graph(&edges(&crate_files()));
    if let Some(cycle) = find_cycle(&graph_of(&modules)) {
        panic!("{}", cycle_message("top-level modules", &cycle));
    }
}

#[test]
fn sibling_files_have_no_import_cycle() {
    let siblings = sibling_edges(&edges(&crate_files()));
    for e in &siblings {
        println!("{}", describe(e));
    }
    if let Some(cycle) = find_cycle(&graph_of(&siblings)) {
        panic!("{}", cycle_message("sibling files", &cycle));
    }
}

/// `fs/` is where the engine's state and every operation on it meet: its
/// files, `mod.rs` among them, import one another without a cycle
/// (docs/SNAPSHOTS.md, "The engine split").
#[test]
fn fs_files_have_no_cycle_including_mod_rs() {
    let fs: Vec<Edge> = sibling_edges(&edges(&crate_files()))
        .into_iter()
        .filter(|e| e.from.starts_with("fs/"))
        .collect();
    assert!(
        fs.iter().any(|e| e.from == "fs/mod.rs"),
        "no import from fs/mod.rs found: the rule would pass trivially"
    );
    if let Some(cycle) = find_cycle(&graph_of(&fs)) {
        panic!("{}", cycle_message("the files of fs/", &cycle));
    }
}

/// The scanner itself: the rules above pass trivially if it finds no edges.
#[test]
fn scanner_finds_use_groups_inline_paths_and_reexports() {
    let file = |rel: &str, text: &str| SourceFile {
        rel: rel.to_string(),
        module: rel
            .trim_end_matches(".rs")
            .trim_end_matches("/mod")
            .split('/')
            .filter(|s| *s != "lib")
            .map(str::to_string)
            .collect(),
        code: source_scan::blank_comments_and_literals(text),
        text: text.to_string(),
    };
    let files = [
        file("lib.rs", "pub mod a; pub mod b;"),
        file("a/mod.rs", "mod x; mod y; pub use x::*; pub use y::Thing;"),
        file("a/x.rs", "pub struct Wide; pub fn f() {}"),
        file(
            "a/y.rs",
            "use super::{Wide, x::f};\n// crate::b::nope\nlet s = \"crate::b::nope\"; pub struct Thing;",
        ),
        file(
            "b.rs",
            "fn g() { crate::a::Thing::new(); }\n#[cfg(test)]\nmod tests { use super::*; use crate::a::x::Wide; }",
        ),
    ];
    let found: Vec<String> = edges(&files).iter().map(describe).collect();
    assert_eq!(
        found,
        [
            "a/mod.rs:1 uses a/x.rs (x)",
            "a/mod.rs:1 uses a/y.rs (y::Thing)",
            "a/y.rs:1 uses a/x.rs (super::Wide)",
            "a/y.rs:1 uses a/x.rs (super::x::f)",
            "b.rs:3 uses a/x.rs (crate::a::x::Wide)",
            "b.rs:1 uses a/y.rs (crate::a::Thing::new)",
        ]
    );
}
