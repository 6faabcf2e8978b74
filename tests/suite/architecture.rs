//! The library's modules form no cycle: no module uses a module that uses it back, directly or
//! around a circle. Read from the source itself (`use` trees and `crate::`/`super::` paths,
//! outside comments, strings and `#[cfg(test)]` modules), so it holds for every future change.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module path (`compaction::engine`; the crate root is empty) → source file.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let mut parts: Vec<String> = relative
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            match parts.last().map(String::as_str) {
                Some("main") if parts.len() == 1 => continue,
                Some("lib") if parts.len() == 1 => parts.clear(),
                Some("mod") => {
                    parts.pop();
                }
                _ => {}
            }
            found.insert(parts.join("::"), path);
        }
    }
    found
}

/// The code of a file without comments, string and char literals, and `#[cfg(test)]` items.
fn code_of(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && raw_string_start(&chars, i)
        {
            let mut hashes = 0;
            let mut j = i + 1;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|h| chars.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    strip_test_items(&out)
}

/// Whether the `r` at `i` opens a raw string (`r"`, `r#"`, `br"`), not ends an identifier.
fn raw_string_start(chars: &[char], i: usize) -> bool {
    let before = |k: usize| i.checked_sub(k).and_then(|j| chars.get(j));
    match before(1) {
        Some('b') => !ident(before(2)),
        other => !ident(other),
    }
}

fn ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Removes each `#[cfg(test)]` item: up to the end of its braced block.
fn strip_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let Some(open) = after.find(['{', ';']) else {
            return out;
        };
        if after.as_bytes()[open] == b';' {
            rest = &after[open + 1..];
            continue;
        }
        let mut depth = 0;
        let mut end = after.len();
        for (k, b) in after.bytes().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// Every path a `use` tree names, expanded (`a::{b, c::d}` → `a::b`, `a::c::d`).
fn expand_use_tree(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree.split(" as ").next().unwrap_or("").to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut items = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..k]);
                start = k + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(|item| {
            expand_use_tree(item)
                .into_iter()
                .map(move |path| match path.as_str() {
                    "self" => prefix.trim_end_matches("::").to_string(),
                    _ => format!("{prefix}{path}"),
                })
        })
        .collect()
}

fn parent(module: &str) -> String {
    module
        .rsplit_once("::")
        .map(|(p, _)| p.to_string())
        .unwrap_or_default()
}

fn join(base: &str, rest: &str) -> String {
    match (base.is_empty(), rest.is_empty()) {
        (true, _) => rest.to_string(),
        (_, true) => base.to_string(),
        _ => format!("{base}::{rest}"),
    }
}

/// The module a path in `module` refers to: the longest known module prefix of it.
fn resolve(module: &str, path: &str, known: &BTreeMap<String, PathBuf>) -> Option<String> {
    let path = path.trim_start_matches("::");
    let absolute = if let Some(rest) = path.strip_prefix("crate::") {
        rest.to_string()
    } else if path.starts_with("super::") || path == "super" {
        let mut base = module.to_string();
        let mut rest = path;
        while let Some(stripped) = rest.strip_prefix("super") {
            base = parent(&base);
            rest = stripped.trim_start_matches("::");
        }
        join(&base, rest)
    } else if let Some(rest) = path.strip_prefix("self::") {
        join(module, rest)
    } else {
        // A relative path whose first segment is a child module.
        let first = path.split("::").next().unwrap_or("");
        let child = join(module, first);
        if module.is_empty() || !known.contains_key(&child) {
            return None;
        }
        join(module, path)
    };
    let segments: Vec<&str> = absolute.split("::").filter(|s| !s.is_empty()).collect();
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|candidate| known.contains_key(candidate))
        .filter(|target| target != module)
}

fn dependencies(module: &str, code: &str, known: &BTreeMap<String, PathBuf>) -> BTreeSet<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let boundary_ok = at == 0 || !ident(rest[..at].chars().last().as_ref());
        let after = &rest[at + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if boundary_ok {
            paths.extend(expand_use_tree(&after[..end]));
        }
        rest = &after[end.min(after.len())..];
    }
    for anchor in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(anchor) {
            let start = at;
            let tail = &rest[start..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            let path = &tail[..len];
            // `super::{…}` and `super::*` are use trees, read above.
            if !ident(rest[..start].chars().last().as_ref()) && !path.ends_with("::") {
                paths.push(path.to_string());
            }
            rest = &tail[len.max(anchor.len())..];
        }
    }
    paths
        .iter()
        .filter_map(|path| resolve(module, path, known))
        .collect()
}

/// A cycle in the graph, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, marks, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
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

fn graph_of(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let known = modules(src);
    known
        .iter()
        .map(|(module, path)| {
            let text = std::fs::read_to_string(path).expect("source is readable");
            (
                module.clone(),
                dependencies(module, &code_of(&text), &known),
            )
        })
        .collect()
}

#[test]
fn library_modules_form_no_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph_of(&src);
    assert!(graph.len() > 20, "found only {} modules", graph.len());
    if let Some(cycle) = find_cycle(&graph) {
        panic!("module cycle: {}", cycle.join(" → "));
    }
}

#[test]
fn the_checker_sees_use_trees_inline_paths_and_cycles() {
    let known: BTreeMap<String, PathBuf> = ["", "a", "a::b", "a::c", "d"]
        .iter()
        .map(|m| (m.to_string(), PathBuf::new()))
        .collect();
    let code = code_of(
        "use super::{b::X, c};\n// use crate::d;\nfn f() { let s = \"crate::d\"; crate::d::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    );
    let deps = dependencies("a::b", &code, &known);
    assert_eq!(
        deps,
        ["a::c", "d"]
            .iter()
            .map(|s| s.to_string())
            .collect::<BTreeSet<_>>()
    );
    let mut graph = BTreeMap::new();
    graph.insert("x".to_string(), BTreeSet::from(["y".to_string()]));
    graph.insert("y".to_string(), BTreeSet::from(["z".to_string()]));
    graph.insert("z".to_string(), BTreeSet::from(["x".to_string()]));
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["x".into(), "y".into(), "z".into(), "x".into()])
    );
    graph.insert("z".to_string(), BTreeSet::new());
    assert_eq!(find_cycle(&graph), None);
}
