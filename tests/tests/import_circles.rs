//! No import circles between the files of a crate: a file never reaches, through `crate::` and
//! `super::` paths in its non-test code, a file that reaches it back. A circle means no part of
//! it can be read, tested or moved on its own (DESIGN.md, "Where the house is going").
//!
//! The check reads each crate's `src/` as text (no Rust parser in the workspace): every file is
//! a module (`a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` the root); comments,
//! string and char literals are blanked, and so is test code (the item after `#[cfg(test)]`,
//! files named `tests.rs` or `*_tests.rs`). Each `crate::…` or `super::…` path, with `use`
//! groups expanded, names the deepest module file it reaches. Two rules keep composition from
//! counting as a circle: a module naming its own descendants is not an edge, and neither is a
//! path to the crate root (re-exports). Each set of files that reach each other is reported with
//! all its files, then one circle through them: each file with the path that leads to the next,
//! the last line being the edge that closes it.
//!
//! Limits: `super` in an inline, non-test `mod name { … }` is read as the file's `super`, and a
//! path spelled through a `use` alias (`use crate::a as b; b::X`) is seen only at its `use`.
//!
//! **Adding a crate** is one line: append its `src` folder to [`CRATES`].

mod source_text;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use source_text::{blank_literals_and_comments, blank_test_code};

/// The crates checked, by their `src` folder relative to the workspace root.
const CRATES: &[&str] = &[
    "gateway/src",
    "mock-engine/src",
    "loadgen/src",
    "router-core/src",
];

/// A module path: `["replicas", "health"]`; the crate root is empty.
type Module = Vec<String>;

/// Files that reach each other, and one circle through them: each file with the path that
/// leads to the next.
#[derive(Debug)]
struct Circle {
    files: Vec<String>,
    steps: Vec<(String, String)>,
}

/// One import: the referring file's path text and where it leads.
#[derive(Debug, Clone)]
struct Edge {
    to: Module,
    /// The path as written, e.g. `crate::state::AppState`.
    via: String,
}

/// A crate's module graph: files and, per module, the modules its non-test code names.
#[derive(Debug, Default)]
struct Graph {
    files: BTreeMap<Module, String>,
    edges: BTreeMap<Module, Vec<Edge>>,
}

impl Graph {
    /// The graph of sources given as (path relative to `src`, text).
    fn from_sources<'a>(sources: impl IntoIterator<Item = (&'a str, &'a str)>) -> Graph {
        let mut graph = Graph::default();
        let mut texts = Vec::new();
        for (path, text) in sources {
            let Some(module) = module_of(path) else {
                continue;
            };
            graph.files.insert(module.clone(), path.to_owned());
            texts.push((module, text));
        }
        for (module, text) in texts {
            let code = blank_test_code(&blank_literals_and_comments(text));
            // `super` of `a/b.rs` and of `a/b/mod.rs` (both `a::b`) is `a`.
            let parent: Module = module[..module.len().saturating_sub(1)].to_vec();
            let mut edges: Vec<Edge> = Vec::new();
            for (path, via) in references(&code, &parent) {
                let Some(to) = graph.resolve(&path) else {
                    continue;
                };
                let own_descendant = to.starts_with(&module);
                if to.is_empty() || own_descendant || edges.iter().any(|e| e.to == to) {
                    continue;
                }
                edges.push(Edge { to, via });
            }
            graph.edges.insert(module, edges);
        }
        graph
    }

    /// The graph of the `.rs` files under `src`.
    fn read(src: &Path) -> Graph {
        let mut sources = Vec::new();
        collect(src, src, &mut sources);
        Graph::from_sources(sources.iter().map(|(p, t)| (p.as_str(), t.as_str())))
    }

    /// The deepest module file a path reaches, if any.
    fn resolve(&self, path: &[String]) -> Option<Module> {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|m| self.files.contains_key(m))
    }

    /// Every set of files that reach each other (more than one), each with one circle through
    /// it: files in order with the path from each to the next.
    fn circles(&self) -> Vec<Circle> {
        strongly_connected(self)
            .into_iter()
            .filter(|component| component.len() > 1)
            .map(|component| {
                let files = component.iter().map(|m| self.files[m].clone()).collect();
                Circle {
                    files,
                    steps: self.cycle_within(&component),
                }
            })
            .collect()
    }

    /// A shortest cycle through the component's first module, inside the component.
    fn cycle_within(&self, component: &BTreeSet<Module>) -> Vec<(String, String)> {
        let start = component.iter().next().expect("a non-empty component");
        let mut came_from: BTreeMap<Module, (Module, String)> = BTreeMap::new();
        let mut frontier = vec![start.clone()];
        'search: while !frontier.is_empty() {
            let mut next = Vec::new();
            for module in frontier {
                for edge in &self.edges[&module] {
                    if !component.contains(&edge.to) || came_from.contains_key(&edge.to) {
                        continue;
                    }
                    came_from.insert(edge.to.clone(), (module.clone(), edge.via.clone()));
                    if &edge.to == start {
                        break 'search;
                    }
                    next.push(edge.to.clone());
                }
            }
            frontier = next;
        }
        let mut steps = Vec::new();
        let mut at = start.clone();
        loop {
            let (from, via) = came_from[&at].clone();
            steps.push((self.files[&from].clone(), via));
            at = from;
            if &at == start {
                break;
            }
        }
        steps.reverse();
        steps
    }
}

/// The module of a file path relative to `src`; `None` for test files.
fn module_of(path: &str) -> Option<Module> {
    let stem = path.strip_suffix(".rs")?;
    let mut parts: Module = stem.split('/').map(str::to_owned).collect();
    let file = parts.last()?.as_str();
    if file == "tests" || file.ends_with("_tests") {
        return None;
    }
    if matches!(file, "mod" | "lib" | "main") {
        parts.pop();
    }
    Some(parts)
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under the root");
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            out.push((relative, text));
        }
    }
}

/// Every `crate::…` and `super::…` path in `code` (groups expanded), as absolute module paths
/// with the text they were written as; `parent` is the module `super` names.
fn references(code: &str, parent: &[String]) -> Vec<(Vec<String>, String)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < code.len() {
        let starts_word = i == 0 || !is_ident_byte(bytes[i - 1]) && bytes[i - 1] != b':';
        let keyword = ["crate::", "super::"]
            .into_iter()
            .find(|k| code[i..].starts_with(k));
        let Some(keyword) = keyword.filter(|_| starts_word) else {
            i += 1;
            continue;
        };
        let mut base: Vec<String> = if keyword == "crate::" {
            Vec::new()
        } else {
            parent.to_vec()
        };
        let written_from = i;
        i += keyword.len();
        // Further `super::`s climb.
        while code[i..].starts_with("super::") {
            base.pop();
            i += "super::".len();
        }
        let (paths, end) = path_tail(code, i);
        let written = code[written_from..end]
            .split_whitespace()
            .collect::<String>();
        for tail in paths {
            let mut path = base.clone();
            path.extend(tail);
            found.push((path, written.clone()));
        }
        i = end.max(i + 1);
    }
    found
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The path segments from `start` (`a::b::C` or `a::{b, c::{d, self}}`), as one or more
/// paths, and where the path ends.
fn path_tail(code: &str, start: usize) -> (Vec<Vec<String>>, usize) {
    let bytes = code.as_bytes();
    let mut segments = Vec::new();
    let mut i = start;
    loop {
        while i < code.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < code.len() && bytes[i] == b'{' {
            let mut paths = Vec::new();
            i += 1;
            loop {
                while i < code.len() && (bytes[i].is_ascii_whitespace() || bytes[i] == b',') {
                    i += 1;
                }
                if i >= code.len() || bytes[i] == b'}' {
                    i += 1;
                    break;
                }
                let (inner, end) = path_tail(code, i);
                for tail in inner {
                    let mut path = segments.clone();
                    // `self` in a group is the group's own module.
                    path.extend(tail.into_iter().filter(|s| s != "self"));
                    paths.push(path);
                }
                // Skip an `as alias` and anything else up to the next item of the group.
                i = end;
                while i < code.len() && bytes[i] != b',' && bytes[i] != b'}' {
                    i += 1;
                }
            }
            return (paths, i);
        }
        let ident_end = (i..code.len())
            .find(|&k| !is_ident_byte(bytes[k]))
            .unwrap_or(code.len());
        if ident_end == i {
            return (vec![segments], i);
        }
        segments.push(code[i..ident_end].to_owned());
        i = ident_end;
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![segments], i);
        }
    }
}

/// Tarjan's strongly connected components, iteratively (no recursion limit to meet).
fn strongly_connected(graph: &Graph) -> Vec<BTreeSet<Module>> {
    let nodes: Vec<&Module> = graph.files.keys().collect();
    let index_of: BTreeMap<&Module, usize> =
        nodes.iter().enumerate().map(|(i, m)| (*m, i)).collect();
    let successors: Vec<Vec<usize>> = nodes
        .iter()
        .map(|m| {
            graph.edges.get(*m).map_or_else(Vec::new, |edges| {
                edges.iter().map(|e| index_of[&e.to]).collect()
            })
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low) = (vec![usize::MAX; n], vec![0; n]);
    let (mut on_stack, mut stack, mut components) = (vec![false; n], Vec::new(), Vec::new());
    let mut counter = 0;
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        // (node, next successor to look at)
        let mut work = vec![(root, 0)];
        while let Some(&mut (v, ref mut next)) = work.last_mut() {
            if *next == 0 && index[v] == usize::MAX {
                index[v] = counter;
                low[v] = counter;
                counter += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = successors[v].get(*next) {
                *next += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = BTreeSet::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.insert(nodes[w].clone());
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// The report of a crate's circles, one paragraph each; empty when there are none.
fn report(src: &str, graph: &Graph) -> String {
    let mut text = String::new();
    for Circle { files, steps } in graph.circles() {
        let files: Vec<String> = files.iter().map(|f| format!("{src}/{f}")).collect();
        text.push_str(&format!(
            "{} files in {src} reach each other: {}\n  for example:\n",
            files.len(),
            files.join(", ")
        ));
        for (k, (file, via)) in steps.iter().enumerate() {
            let closes = if k + 1 == steps.len() {
                "   <- closes the circle"
            } else {
                ""
            };
            text.push_str(&format!("    {src}/{file} uses {via}{closes}\n"));
        }
    }
    text
}

#[test]
fn no_crate_has_an_import_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut failures = String::new();
    for src in CRATES {
        let graph = Graph::read(&workspace.join(src));
        assert!(graph.files.len() > 1, "{src}: no source files found");
        failures.push_str(&report(src, &graph));
    }
    assert!(failures.is_empty(), "import circles:\n{failures}");
}

#[test]
fn the_checker_finds_a_circle_and_names_the_edge_that_closes_it() {
    let graph = Graph::from_sources([
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a.rs", "use crate::b::Thing;\n"),
        ("b.rs", "use crate::{c::{self, Other}};\n"),
        ("c.rs", "pub fn f() -> crate::a::Start { todo!() }\n"),
    ]);
    let text = report("src", &graph);
    assert_eq!(
        text,
        "3 files in src reach each other: src/a.rs, src/b.rs, src/c.rs\n  for example:\n    \
         src/a.rs uses crate::b::Thing\n    \
         src/b.rs uses crate::{c::{self,Other}}\n    \
         src/c.rs uses crate::a::Start   <- closes the circle\n"
    );
}

#[test]
fn super_climbs_from_the_files_module() {
    // `super` in `x/mod.rs` is the root; in `x/y.rs` it is `x`; `super::super` climbs twice.
    let graph = Graph::from_sources([
        ("lib.rs", ""),
        ("x/mod.rs", "use super::z::Z;\n"),
        ("x/y.rs", "use super::super::z;\n"),
        ("z.rs", "use crate::x::y::Y;\n"),
    ]);
    let circles = graph.circles();
    assert_eq!(circles.len(), 1, "{}", report("src", &graph));
    assert_eq!(circles[0].files, ["x/y.rs", "z.rs"]);
}

#[test]
fn composition_tests_comments_and_strings_are_no_circle() {
    let graph = Graph::from_sources([
        ("lib.rs", "pub use a::A;\n"),
        // A module naming its own descendants, and a child naming its parent.
        (
            "a/mod.rs",
            "pub mod b;\npub use crate::a::b::B;\nuse crate::c::C;\n",
        ),
        ("a/b.rs", "use super::A;\n"),
        // Test code, comments and strings naming `a` are not imports.
        (
            "c.rs",
            "// crate::a::A\n/* crate::a::A */\nconst S: &str = \"crate::a::A\";\n\
             const R: &str = r#\"crate::a::A {\"#;\nconst C: char = '{';\n\
             #[cfg(test)]\nmod tests { use crate::a::A; fn f() { let _ = '}'; } }\n\
             #[cfg(test)]\nmod more_tests;\npub struct C;\n",
        ),
        ("c_tests.rs", "use crate::a::A;\n"),
        ("tests.rs", "use crate::a::A;\n"),
        // The root is composition too.
        ("d.rs", "use crate::A;\n"),
    ]);
    assert_eq!(report("src", &graph), "");
    assert_eq!(graph.edges[&vec!["a".to_owned()]].len(), 1, "a -> c only");
    assert!(graph.edges[&vec!["c".to_owned()]].is_empty());
    // Code after a test item still counts.
    let graph = Graph::from_sources([
        ("lib.rs", ""),
        ("a.rs", "#[cfg(test)]\nmod tests { }\nuse crate::b::B;\n"),
        ("b.rs", "use crate::a::A;\n"),
    ]);
    assert_eq!(graph.circles().len(), 1);
}
