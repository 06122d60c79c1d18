//! No function on the request path is longer than [`MAX_LINES`] lines (issue 16): a request's
//! steps stay readable one screen at a time, and a step that grows past it is split where a
//! reader would name its parts.
//!
//! What is counted: in the files of [`REQUEST_PATH`] (the gateway's request steps, and
//! router-core's decision: the router, its policies, the index, hashing, tokenizing, the
//! load view and the body parse), every `fn` item outside test code (files named `tests.rs`
//! or `*_tests.rs`, and the item after `#[cfg(test)]`, are skipped), from the line of its
//! `fn` to the line of the `}` closing its body, found by brace matching once comments and
//! literals are blanked. Blank and comment lines inside a body count, as a reader sees them;
//! a nested `fn` counts within its parent and on its own. Limits: a `{` inside a function's
//! signature (a const-generic block) would be taken for its body.

mod source_text;

use std::path::{Path, PathBuf};

use source_text::{blank_literals_and_comments, blank_test_code};

/// The longest a request-path function may be, in lines.
const MAX_LINES: usize = 80;

/// The request path's source files and folders (every `.rs` below a folder), relative to the
/// workspace root.
const REQUEST_PATH: &[&str] = &[
    "gateway/src/request",
    "gateway/src/ext_proc",
    "router-core/src/router.rs",
    "router-core/src/policy",
    "router-core/src/index",
    "router-core/src/hash.rs",
    "router-core/src/tokenize",
    "router-core/src/load",
    "router-core/src/decision.rs",
    "router-core/src/text.rs",
];

/// Functions allowed past [`MAX_LINES`] for now, by file and name, each with its reason. The
/// test fails once one of them fits, so that its entry goes.
const NOT_YET: &[(&str, &str, &str)] = &[];

/// Every function longer than `max` lines in `text`: (name, line of its `fn`, lines).
fn long_functions(text: &str, max: usize) -> Vec<(String, usize, usize)> {
    let code = blank_test_code(&blank_literals_and_comments(text));
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut long = Vec::new();
    let mut at = 0;
    while let Some(found) = code[at..].find("fn ") {
        let start = at + found;
        at = start + 3;
        if start > 0 && is_ident(bytes[start - 1]) {
            continue;
        }
        let name: String = code[at..]
            .chars()
            .take_while(|&c| c.is_alphanumeric() || c == '_')
            .collect();
        if name.is_empty() {
            continue; // `fn(` in a type
        }
        // The body is the first `{` after the name; a `;` first means no body (a trait's
        // required method or an extern declaration).
        let Some(open) = code[at..].find(['{', ';']).map(|k| at + k) else {
            break;
        };
        if bytes[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, &b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else { break };
        let first_line = code[..start].matches('\n').count() + 1;
        let lines = code[start..=close].matches('\n').count() + 1;
        if lines > max {
            long.push((name, first_line, lines));
        }
    }
    long
}

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .unwrap_or_else(|e| panic!("cannot list {}: {e}", path.display()))
            .map(|entry| entry.unwrap().path())
            .collect();
        entries.sort();
        for entry in entries {
            rust_files(&entry, out);
        }
    } else if path.extension().is_some_and(|ext| ext == "rs") {
        let name = path.file_name().unwrap().to_string_lossy();
        if name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(path.to_owned());
        }
    }
}

#[test]
fn no_request_path_function_is_longer_than_the_limit() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for part in REQUEST_PATH {
        let path = root.join(part);
        assert!(path.exists(), "{part} is gone: update REQUEST_PATH");
        rust_files(&path, &mut files);
    }
    let mut report = String::new();
    let mut excused = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file
            .strip_prefix(&root)
            .unwrap_or(file)
            .display()
            .to_string();
        for (name, line, lines) in long_functions(&text, MAX_LINES) {
            if NOT_YET.iter().any(|&(f, n, _)| f == shown && n == name) {
                excused.push((shown.clone(), name));
                continue;
            }
            report.push_str(&format!("{shown}:{line}: fn {name} is {lines} lines\n"));
        }
    }
    assert!(
        report.is_empty(),
        "request-path functions over {MAX_LINES} lines (split them):\n{report}"
    );
    for (file, name, _) in NOT_YET {
        assert!(
            excused.iter().any(|(f, n)| f == file && n == name),
            "{file}: fn {name} now fits in {MAX_LINES} lines: remove it from NOT_YET"
        );
    }
}

#[test]
fn the_counter_matches_braces_and_skips_literals_declarations_and_tests() {
    let text = "fn short() {\n    let s = \"{{{\";\n}\n\
                trait T { fn declared(&self); }\n\
                fn long() {\n    // }\n    x();\n    y();\n}\n\
                #[cfg(test)]\nmod tests {\n    fn in_tests() {\n\n\n\n\n\n}\n}\n";
    assert_eq!(long_functions(text, 3), [("long".to_owned(), 5, 5)]);
    assert!(long_functions(text, 5).is_empty());
}
