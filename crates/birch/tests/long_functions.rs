//! No function in crates/birch/src runs over [`MAX_LINES`] lines unless its
//! doc comment says why, in a paragraph starting `Long because`: a long
//! function with phases marked by comments reads better as named steps.
//! `cargo test -p birch --test long_functions -- --nocapture` lists every
//! long function with its reason.

mod source_scan;

use source_scan::{read_crate, tokens, SourceFile};
use std::path::Path;

/// The most lines a function may span (signature to closing brace).
const MAX_LINES: usize = 100;

/// The phrase that starts a stated reason in a long function's doc comment.
const REASON: &str = "Long because";

/// A function of the crate: where it starts, how long it is, its doc.
struct Function {
    file: String,
    name: String,
    line: usize,
    lines: usize,
    doc: String,
}

/// Every `fn` with a body, with its span in lines and its doc comment.
fn functions(file: &SourceFile) -> Vec<Function> {
    let toks = tokens(&file.code);
    let text_lines: Vec<&str> = file.text.lines().collect();
    let mut out = Vec::new();
    for (i, t) in toks.iter().enumerate() {
        if t.text != "fn" {
            continue;
        }
        // `fn(u64) -> T` is a type, not an item.
        let Some(name) = toks.get(i + 1).filter(|n| n.text != "(") else {
            continue;
        };
        // The body opens at the first `{` outside the signature's
        // parentheses; a `;` first means a declaration without one.
        let mut parens = 0i32;
        let mut open = None;
        for (j, u) in toks.iter().enumerate().skip(i + 2) {
            match u.text.as_str() {
                "(" | "[" => parens += 1,
                ")" | "]" => parens -= 1,
                ";" if parens == 0 => break,
                "{" if parens == 0 => {
                    open = Some(j);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else {
            continue;
        };
        let mut depth = 0;
        let close = toks[open..].iter().position(|u| {
            match u.text.as_str() {
                "{" => depth += 1,
                "}" => depth -= 1,
                _ => {}
            }
            depth == 0
        });
        let Some(close) = close else {
            continue;
        };
        let end_line = toks[open + close].line;
        out.push(Function {
            file: file.rel.clone(),
            name: name.text.clone(),
            line: t.line,
            lines: end_line - t.line + 1,
            doc: doc_comment(&text_lines, t.line),
        });
    }
    out
}

/// The `///` lines above line `line` (1-based), skipping attributes and the
/// rest of a signature that starts above the `fn` (`pub(crate)`).
fn doc_comment(lines: &[&str], line: usize) -> String {
    let mut doc = Vec::new();
    let mut at = line - 1;
    while at > 0 {
        let above = lines[at - 1].trim();
        if let Some(d) = above.strip_prefix("///") {
            doc.push(d.trim());
        } else if !(above.starts_with("#[") || above.is_empty() && doc.is_empty()) {
            break;
        }
        at -= 1;
    }
    doc.reverse();
    doc.join(" ")
}

fn long_functions() -> Vec<Function> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    read_crate(&src)
        .iter()
        .flat_map(functions)
        .filter(|f| f.lines > MAX_LINES)
        .collect()
}

#[test]
fn long_functions_say_why() {
    let long = long_functions();
    let mut unexplained = Vec::new();
    for f in &long {
        let reason = f.doc.find(REASON).map(|at| &f.doc[at..]);
        println!(
            "{}:{} {} ({} lines): {}",
            f.file,
            f.line,
            f.name,
            f.lines,
            reason.unwrap_or("NO REASON")
        );
        if reason.is_none() {
            unexplained.push(format!(
                "{}:{} fn {} is {} lines",
                f.file, f.line, f.name, f.lines
            ));
        }
    }
    assert!(
        unexplained.is_empty(),
        "functions over {MAX_LINES} lines without a `{REASON} …` paragraph in their doc comment \
         (split them into named steps, or say why not):\n{}",
        unexplained.join("\n")
    );
}

/// The scanner measures what it should: a body's braces, not a
/// signature's, and a doc comment above attributes.
#[test]
fn function_spans_and_docs_are_measured() {
    let text = "/// Does a.\n/// Long because b.\n#[inline]\npub fn a(x: [u8; 2]) -> u8 {\n    let s = \"}\";\n    { x[0] }\n}\ntrait T { fn d(); }\nfn e(f: fn(u8) -> u8) {}\n";
    let file = SourceFile {
        rel: "x.rs".into(),
        module: vec!["x".into()],
        code: source_scan::blank_comments_and_literals(text),
        text: text.into(),
    };
    let found: Vec<(String, usize, usize, String)> = functions(&file)
        .into_iter()
        .map(|f| (f.name, f.line, f.lines, f.doc))
        .collect();
    assert_eq!(
        found,
        vec![
            ("a".into(), 4, 4, "Does a. Long because b.".into()),
            ("e".into(), 9, 1, String::new()),
        ]
    );
}
