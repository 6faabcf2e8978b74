//! The library's modules form no cycle: no module uses a module that uses it back, directly or
//! around a circle. Read from the source itself, parsed as Rust with `syn` (`use` trees and
//! `crate::`/`super::` paths, in code and in macro bodies, outside `#[cfg(test)]` items), so it
//! holds for every future change.

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

/// Every path a file names that may be a module of this crate: each `use` tree expanded
/// (`a::{b, c::d}` → `a::b`, `a::c::d`), and each `crate::`, `super::` or `self::` path in the
/// code and in macro bodies; nothing inside a `#[cfg(test)]` item.
fn paths_of(file: &syn::File) -> Vec<String> {
    let mut paths = Paths(Vec::new());
    syn::visit::visit_file(&mut paths, file);
    paths.0
}

struct Paths(Vec<String>);

fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .meta
                .require_list()
                .is_ok_and(|list| list.tokens.to_string() == "test")
    })
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        syn::Item::Const(item) => &item.attrs,
        syn::Item::Static(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Enum(item) => &item.attrs,
        syn::Item::Trait(item) => &item.attrs,
        _ => &[],
    }
}

fn anchored(first: &str) -> bool {
    matches!(first, "crate" | "super" | "self")
}

impl<'ast> syn::visit::Visit<'ast> for Paths {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_cfg_test(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if !is_cfg_test(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        expand_use_tree(&item.tree, "", &mut self.0);
    }

    /// `pub(super)` or `pub(in crate::a)` says who may use an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.first().is_some_and(|first| anchored(first)) {
            self.0.push(segments.join("::"));
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        macro_paths(mac.tokens.clone(), &mut self.0);
        syn::visit::visit_macro(self, mac);
    }
}

/// `crate::a::b` runs inside a macro's tokens, which syn leaves unparsed.
fn macro_paths(tokens: proc_macro2::TokenStream, out: &mut Vec<String>) {
    use proc_macro2::TokenTree;
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(group) => macro_paths(group.stream(), out),
            TokenTree::Ident(first) if anchored(&first.to_string()) => {
                let mut segments = vec![first.to_string()];
                let mut j = i + 1;
                while let (
                    Some(TokenTree::Punct(a)),
                    Some(TokenTree::Punct(b)),
                    Some(TokenTree::Ident(next)),
                ) = (tokens.get(j), tokens.get(j + 1), tokens.get(j + 2))
                {
                    if a.as_char() != ':' || b.as_char() != ':' {
                        break;
                    }
                    segments.push(next.to_string());
                    j += 3;
                }
                if segments.len() > 1 {
                    out.push(segments.join("::"));
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

/// Every path a `use` tree names, expanded; `self` in a group names the group's prefix.
fn expand_use_tree(tree: &syn::UseTree, prefix: &str, out: &mut Vec<String>) {
    let joined = |name: &str| {
        if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}::{name}")
        }
    };
    match tree {
        syn::UseTree::Path(path) => {
            expand_use_tree(&path.tree, &joined(&path.ident.to_string()), out)
        }
        syn::UseTree::Name(name) if name.ident == "self" => out.push(prefix.to_string()),
        syn::UseTree::Name(name) => out.push(joined(&name.ident.to_string())),
        syn::UseTree::Rename(rename) if rename.ident == "self" => out.push(prefix.to_string()),
        syn::UseTree::Rename(rename) => out.push(joined(&rename.ident.to_string())),
        syn::UseTree::Glob(_) => out.push(prefix.to_string()),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                expand_use_tree(tree, prefix, out);
            }
        }
    }
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

fn dependencies(
    module: &str,
    file: &syn::File,
    known: &BTreeMap<String, PathBuf>,
) -> BTreeSet<String> {
    paths_of(file)
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
            let file = syn::parse_file(&text).expect("source parses");
            (module.clone(), dependencies(module, &file, &known))
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
    let code = syn::parse_file(
        "use super::{b::X, c};\n// use crate::d;\npub(super) fn v() {}\nfn f() { let s = \"crate::d\"; crate::d::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    )
    .expect("parses");
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
