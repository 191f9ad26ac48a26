//! The crate's module graph has no import cycle: every file of `src/` is a node, and
//! a `use crate::…`, `use super::…` or `use self::…` (or such a path written inline
//! in code) is an edge to the file that defines what it names. A name re-exported by
//! a `pub use` is followed to the file that defines it, so importing through a
//! module's facade does not tie the importer to the facade's other children. Test
//! modules and comments are not read. A cycle fails the test with its files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module path inside the crate (`[]` is the crate root, `["engine", "world"]`
/// is `src/engine/world.rs`).
type ModPath = Vec<String>;

/// One `use` leaf or inline path: its segments as written, and the name it binds
/// (`None` for a glob or an inline path).
#[derive(Debug)]
struct UsePath {
    segments: Vec<String>,
    binds: Option<String>,
    public: bool,
}

/// The code of a file without its test module and its comment lines.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Splits a use tree (`a::{b, c::d as e, f::*}`) into its leaves.
fn use_leaves(tree: &str, prefix: &[String], public: bool, out: &mut Vec<UsePath>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        let mut base = prefix.to_vec();
        base.extend(head);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let (mut depth, mut start) = (0, 0);
        for (i, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    use_leaves(&inner[start..i], &base, public, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        use_leaves(&inner[start..], &base, public, out);
        return;
    }
    if tree.is_empty() {
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut segments = prefix.to_vec();
    segments.extend(path.split("::").map(|s| s.trim().to_owned()));
    let last = segments.last().cloned().unwrap_or_default();
    let binds = match (alias, last.as_str()) {
        (_, "*") => None,
        (Some(a), _) => Some(a),
        (None, "self") => segments.iter().rev().nth(1).cloned(),
        (None, _) => Some(last.clone()),
    };
    if last == "self" {
        segments.pop();
    }
    if last == "*" {
        segments.pop();
    }
    out.push(UsePath {
        segments,
        binds,
        public,
    });
}

/// The `use` leaves and inline paths of a file's code.
fn paths_of(code: &str) -> Vec<UsePath> {
    let mut out = Vec::new();
    let mut rest = code;
    let mut outside_uses = String::new();
    while let Some(i) = find_use(rest) {
        outside_uses.push_str(&rest[..i]);
        let public = rest[..i].trim_end().ends_with(')') || rest[..i].trim_end().ends_with("pub");
        let stmt = &rest[i + 4..];
        let end = stmt.find(';').unwrap_or(stmt.len());
        use_leaves(&stmt[..end], &[], public, &mut out);
        rest = &stmt[end..];
    }
    outside_uses.push_str(rest);
    // Inline paths: `crate::a::b`, `super::a`, `self::a` in code.
    let bytes = outside_uses.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(j) = outside_uses[from..].find(root) {
            let at = from + j;
            from = at + root.len();
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_') {
                continue;
            }
            let len = outside_uses[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(outside_uses.len() - at);
            let segments: Vec<String> = outside_uses[at..at + len]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            out.push(UsePath {
                segments,
                binds: None,
                public: false,
            });
        }
    }
    out
}

/// The byte offset of the next `use` keyword that starts a statement.
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(j) = code[from..].find("use ") {
        let at = from + j;
        let before = code[..at].chars().next_back();
        if before.is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}') {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// The crate's files as module paths, with the paths each file names.
struct Crate {
    files: BTreeMap<ModPath, Vec<UsePath>>,
}

impl Crate {
    fn from_sources(sources: &[(ModPath, String)]) -> Self {
        Self {
            files: sources
                .iter()
                .map(|(m, text)| (m.clone(), paths_of(&code_of(text))))
                .collect(),
        }
    }

    fn read(src: &Path) -> Self {
        let mut sources = Vec::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("src/ is readable") {
                let p = e.expect("a directory entry").path();
                if p.is_dir() {
                    stack.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    let rel = p.strip_prefix(src).expect("under src/");
                    let mut m: ModPath = rel
                        .with_extension("")
                        .iter()
                        .map(|s| s.to_string_lossy().into_owned())
                        .collect();
                    if matches!(m.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                        m.pop();
                    }
                    sources.push((m, std::fs::read_to_string(&p).expect("a source file")));
                }
            }
        }
        Self::from_sources(&sources)
    }

    /// The file that defines what `segments` names, seen from `from`.
    fn resolve(&self, from: &ModPath, segments: &[String], depth: u32) -> Option<ModPath> {
        let mut cur = from.clone();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => cur.clear(),
            Some("super" | "self") => {}
            _ => return None,
        }
        while let Some(s) = rest.first().map(String::as_str) {
            match s {
                "crate" => cur.clear(),
                "super" => {
                    cur.pop()?;
                }
                "self" => {}
                _ => break,
            }
            rest = &rest[1..];
        }
        for (i, s) in rest.iter().enumerate() {
            let mut child = cur.clone();
            child.push(s.clone());
            if self.files.contains_key(&child) {
                cur = child;
                continue;
            }
            // A name re-exported here: follow it to where it is defined.
            let reexport = self.files.get(&cur).and_then(|paths| {
                paths
                    .iter()
                    .find(|p| p.public && p.binds.as_deref() == Some(s.as_str()))
            });
            if let Some(p) = reexport.filter(|_| depth < 8) {
                let mut next = p.segments.clone();
                next.extend(rest[i + 1..].iter().cloned());
                return self.resolve(&cur, &next, depth + 1).or(Some(cur));
            }
            return Some(cur);
        }
        Some(cur)
    }

    /// Each file and the files it imports from (itself and its ancestors' facades
    /// without a definition of their own are not edges to themselves).
    fn graph(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        self.files
            .iter()
            .map(|(m, paths)| {
                let to = paths
                    .iter()
                    .filter_map(|p| self.resolve(m, &p.segments, 0))
                    .filter(|t| t != m)
                    .collect();
                (m.clone(), to)
            })
            .collect()
    }
}

/// Every strongly connected set of more than one file (Tarjan), each sorted.
fn cycles(g: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a ModPath) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let Some((w, _)) = s.g.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                scc.push(if w.is_empty() {
                    "lib".to_owned()
                } else {
                    w.join("::")
                });
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn m(p: &str) -> ModPath {
    p.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn lookup_sim_has_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let krate = Crate::read(&src);
    assert!(krate.files.len() > 20, "read {} files", krate.files.len());
    let found = cycles(&krate.graph());
    assert!(
        found.is_empty(),
        "import cycles among lookup-sim's files (each line one cycle): {found:#?}"
    );
}

#[test]
fn the_check_finds_cycles_and_follows_re_exports() {
    let src = |p: &str, t: &str| (m(p), t.to_owned());
    // a -> b -> a, through a facade's re-export and an inline path.
    let sources = [
        src("", "pub mod a;\npub mod f;\n"),
        src("a", "use crate::f::Thing;\n"),
        src("f", "mod b;\npub use self::b::Thing;\n"),
        src("f::b", "pub struct Thing;\nfn g() { crate::a::h(); }\n"),
    ];
    let k = Crate::from_sources(&sources);
    assert_eq!(
        k.resolve(&m("a"), &m("crate::f::Thing"), 0),
        Some(m("f::b"))
    );
    assert_eq!(
        cycles(&k.graph()),
        vec![vec!["a".to_owned(), "f::b".to_owned()]]
    );
    // The same without the inline call: no cycle, and a facade's other children are
    // not tied to an importer of one of them.
    let sources = [
        src("", "pub mod a;\npub mod f;\n"),
        src(
            "a",
            "use crate::f::{Thing, c::{self, Other as O}};\n// use crate::a;\n",
        ),
        src(
            "f",
            "mod b;\npub mod c;\npub use self::b::Thing;\nuse super::a::X;\n",
        ),
        src("f::b", "pub struct Thing;\n"),
        src(
            "f::c",
            "pub struct Other;\n#[cfg(test)]\nmod tests {\n use crate::a;\n}\n",
        ),
    ];
    let k = Crate::from_sources(&sources);
    let g = k.graph();
    assert_eq!(g[&m("a")], [m("f::b"), m("f::c")].into_iter().collect());
    assert_eq!(g[&m("f")], [m("a"), m("f::b")].into_iter().collect());
    assert!(g[&m("f::c")].is_empty());
    assert!(cycles(&g).is_empty());
}
