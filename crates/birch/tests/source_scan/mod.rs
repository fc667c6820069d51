//! A small reader of birch's own source, shared by the tests that hold its
//! structure in place (`layers`: the import graph; `long_functions`: function
//! length). It is not a Rust parser: it blanks comments and literals, splits
//! what is left into tokens, and knows just enough of `use` trees, module
//! paths and `fn` items for those two rules.

// Each test binary compiles this module on its own and uses a subset of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of the crate.
pub struct SourceFile {
    /// Path under `src/`, with `/` separators: `fs/inode.rs`.
    pub rel: String,
    /// Module path: `["fs", "inode"]`; `[]` for lib.rs.
    pub module: Vec<String>,
    /// The text as written.
    pub text: String,
    /// The text with comments, strings and char literals blanked to spaces
    /// (newlines kept, so line numbers match `text`).
    pub code: String,
}

/// Every `.rs` file under `dir`, sorted by path.
pub fn read_crate(src: &Path) -> Vec<SourceFile> {
    let mut paths = Vec::new();
    collect(src, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            let code = blank_comments_and_literals(&text);
            SourceFile {
                module: module_path(&rel),
                rel,
                text,
                code,
            }
        })
        .collect()
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `fs/inode.rs` → `["fs", "inode"]`, `fs/mod.rs` → `["fs"]`, `lib.rs` → `[]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Replaces comments, string literals (plain, byte, raw) and char literals
/// with spaces, keeping newlines; lifetimes stay.
pub fn blank_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"..", r#".."#, br#".."#: ends at a quote followed by as many #.
            let open = chars[i..].iter().position(|&c| c == '"').expect("quote") + i;
            for &c in &chars[i..=open] {
                blank(&mut out, c);
            }
            i = open + 1;
            while i < chars.len() {
                let closes =
                    chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#'));
                if closes {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += hashes + 1;
                    break;
                }
                blank(&mut out, chars[i]);
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
                if i < chars.len() {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && is_char_literal(&chars, i) {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At a raw string's `r` (or `br`): how many `#` it opens with.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let prev_is_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    if prev_is_ident {
        return None;
    }
    let mut j = i;
    if chars.get(j) == Some(&'b') {
        j += 1;
    }
    if chars.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    (chars.get(j + hashes) == Some(&'"')).then_some(hashes)
}

/// A `'` starts a char literal (`'a'`, `'\n'`, `'\u{1F600}'`), not a
/// lifetime (`'a`).
fn is_char_literal(chars: &[char], i: usize) -> bool {
    match chars.get(i + 1) {
        Some('\\') => true,
        Some(_) => chars.get(i + 2) == Some(&'\''),
        None => false,
    }
}

/// A token of blanked code, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    pub text: String,
    pub line: usize,
}

/// Identifiers, `::`, and single punctuation characters.
pub fn tokens(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push(Token {
                text: chars[start..i].iter().collect(),
                line,
            });
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            out.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    out
}

/// A path a file names: `crate::format::Key` in `fs/inode.rs`, as written,
/// with the module the path is written in (an inline `mod tests` adds a
/// segment).
#[derive(Debug, Clone)]
pub struct PathUse {
    pub segments: Vec<String>,
    pub line: usize,
    /// Module the path is written in.
    pub scope: Vec<String>,
    /// The path is the prefix of a `use` (a relative first segment names a
    /// child module of `scope`).
    pub in_use: bool,
}

/// Every `crate::`, `super::` and `self::` path in a file, and every path of
/// a `use` declaration, flattened out of `{}` groups.
pub fn paths(file: &SourceFile) -> Vec<PathUse> {
    let toks = tokens(&file.code);
    let mut out = Vec::new();
    // Inline modules: (name, brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].text.as_str();
        let scope = || {
            let mut s = file.module.clone();
            s.extend(inline.iter().map(|(n, _)| n.clone()));
            s
        };
        match t {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d > depth) {
                    inline.pop();
                }
            }
            "mod" if toks.get(i + 2).is_some_and(|t| t.text == "{") => {
                inline.push((toks[i + 1].text.clone(), depth + 1));
                depth += 1;
                i += 3;
                continue;
            }
            "use" => {
                let end = (i..toks.len())
                    .find(|&j| toks[j].text == ";")
                    .unwrap_or(toks.len());
                let mut trees = Vec::new();
                use_tree(&toks[i + 1..end], &[], &mut trees);
                let scope = scope();
                out.extend(trees.into_iter().map(|segments| PathUse {
                    segments,
                    line: toks[i].line,
                    scope: scope.clone(),
                    in_use: true,
                }));
                i = end + 1;
                continue;
            }
            "crate" | "super" | "self" if toks.get(i + 1).is_some_and(|t| t.text == "::") => {
                let prev_is_path = i > 0 && toks[i - 1].text == "::";
                if !prev_is_path {
                    let mut segments = vec![t.to_string()];
                    let mut j = i + 1;
                    while toks.get(j).is_some_and(|t| t.text == "::")
                        && toks.get(j + 1).is_some_and(|t| is_ident(&t.text))
                    {
                        segments.push(toks[j + 1].text.clone());
                        j += 2;
                    }
                    out.push(PathUse {
                        segments,
                        line: toks[i].line,
                        scope: scope(),
                        in_use: false,
                    });
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Flattens a use tree (`a::{b, c::{d, e}}`) into its paths; `as` renames
/// and globs end a path.
fn use_tree(toks: &[Token], prefix: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = prefix.to_vec();
    let mut i = 0;
    while i < toks.len() {
        let t = toks[i].text.as_str();
        match t {
            "::" => {}
            "{" => {
                let close = matching_brace(toks, i);
                for group in split_top_level_commas(&toks[i + 1..close]) {
                    use_tree(group, &path, out);
                }
                return;
            }
            "as" | "*" => break,
            // `a::{self, b}`: `self` is `a` itself.
            "self" if !path.is_empty() => {}
            _ if is_ident(t) => path.push(t.to_string()),
            _ => {}
        }
        i += 1;
    }
    if !path.is_empty() {
        out.push(path);
    }
}

fn matching_brace(toks: &[Token], open: usize) -> usize {
    let mut depth = 0;
    for (j, t) in toks.iter().enumerate().skip(open) {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return j;
                }
            }
            _ => {}
        }
    }
    toks.len()
}

fn split_top_level_commas(toks: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (j, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                out.push(&toks[start..j]);
                start = j + 1;
            }
            _ => {}
        }
    }
    out.push(&toks[start..]);
    out
}

/// Names a file declares at its top level (`struct`, `enum`, `fn`, `const`,
/// `static`, `type`, `trait`, `mod`), for resolving `pub use child::*`.
pub fn top_level_names(file: &SourceFile) -> BTreeSet<String> {
    let toks = tokens(&file.code);
    let mut names = BTreeSet::new();
    let mut depth = 0;
    for (i, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "struct" | "enum" | "fn" | "const" | "static" | "type" | "trait" | "mod"
                if depth == 0 =>
            {
                if let Some(name) = toks.get(i + 1).filter(|t| is_ident(&t.text)) {
                    names.insert(name.text.clone());
                }
            }
            _ => {}
        }
    }
    names
}

/// An import edge between two files of the crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub line: usize,
    /// The path as written, `crate::print::tree_name`.
    pub path: String,
}

/// Every file-to-file edge of the crate. A path resolves to the file of its
/// longest module prefix; a name a `mod.rs` (or lib.rs) re-exports from a
/// child resolves to that child, so `super::Attr` in `fs/inode.rs` names
/// `fs/types.rs` when fs/mod.rs has `pub use types::*`.
pub fn edges(files: &[SourceFile]) -> Vec<Edge> {
    let by_module: BTreeMap<Vec<String>, &SourceFile> =
        files.iter().map(|f| (f.module.clone(), f)).collect();
    let reexports = reexports(files, &by_module);
    let mut out = BTreeSet::new();
    for file in files {
        for p in paths(file) {
            let Some(abs) = absolute(&p, &by_module) else {
                continue;
            };
            let Some(target) = resolve(&abs, &by_module, &reexports) else {
                continue;
            };
            if target != file.rel {
                out.insert(Edge {
                    from: file.rel.clone(),
                    to: target,
                    line: p.line,
                    path: p.segments.join("::"),
                });
            }
        }
    }
    out.into_iter().collect()
}

/// `crate::a::b`, `super::b`, `self::b` and (in a `use`) `child::b` as an
/// absolute module path; `None` for paths outside the crate (`std::…`).
fn absolute(p: &PathUse, by_module: &BTreeMap<Vec<String>, &SourceFile>) -> Option<Vec<String>> {
    let mut segs = p.segments.iter();
    let first = segs.next()?;
    let mut base = match first.as_str() {
        "crate" => Vec::new(),
        "self" => p.scope.clone(),
        "super" => {
            let mut s = p.scope.clone();
            s.pop();
            s
        }
        child if p.in_use => {
            let mut s = p.scope.clone();
            s.push(child.to_string());
            if !by_module.contains_key(&s) {
                return None;
            }
            s
        }
        _ => return None,
    };
    let mut rest: Vec<String> = segs.cloned().collect();
    while rest.first().is_some_and(|s| s == "super") {
        base.pop();
        rest.remove(0);
    }
    base.extend(rest);
    Some(base)
}

/// Names each module file re-exports, and from which file.
type Reexports = BTreeMap<Vec<String>, BTreeMap<String, String>>;

fn reexports(files: &[SourceFile], by_module: &BTreeMap<Vec<String>, &SourceFile>) -> Reexports {
    let mut out: Reexports = BTreeMap::new();
    for file in files {
        let toks = tokens(&file.code);
        for (i, t) in toks.iter().enumerate() {
            // `pub use` and `pub(crate) use` at any depth of this file's own
            // module (not inside inline modules: birch has none that re-export).
            if t.text != "use" || i == 0 {
                continue;
            }
            let is_pub = toks[i - 1].text == "pub"
                || (toks[i - 1].text == ")" && i >= 4 && toks[i - 4].text == "pub");
            if !is_pub {
                continue;
            }
            let end = (i..toks.len())
                .find(|&j| toks[j].text == ";")
                .unwrap_or(toks.len());
            let glob = toks[i..end].iter().any(|t| t.text == "*");
            let mut trees = Vec::new();
            use_tree(&toks[i + 1..end], &[], &mut trees);
            let names = out.entry(file.module.clone()).or_default();
            for tree in trees {
                let mut child = file.module.clone();
                child.push(tree[0].clone());
                let Some(child_file) = by_module.get(&child) else {
                    continue;
                };
                if glob && tree.len() == 1 {
                    for name in top_level_names(child_file) {
                        names.entry(name).or_insert_with(|| child_file.rel.clone());
                    }
                } else if let Some(name) = tree.last() {
                    names.insert(name.clone(), child_file.rel.clone());
                }
            }
        }
    }
    out
}

/// The file an absolute path lands in: its longest module prefix, or the
/// child file that module re-exports the next segment from.
fn resolve(
    abs: &[String],
    by_module: &BTreeMap<Vec<String>, &SourceFile>,
    reexports: &Reexports,
) -> Option<String> {
    for len in (0..=abs.len()).rev() {
        let Some(file) = by_module.get(&abs[..len]) else {
            continue;
        };
        if let Some(next) = abs.get(len) {
            if let Some(child) = reexports.get(&abs[..len]).and_then(|m| m.get(next)) {
                return Some(child.clone());
            }
        }
        return Some(file.rel.clone());
    }
    None
}
