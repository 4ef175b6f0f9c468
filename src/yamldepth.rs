//! A bound on the nesting depth of YAML text, checked in one linear pass before the text is
//! handed to yaml_serde (the `--config-file` and the `--web-config-file`).
//!
//! yaml_serde parses the whole event stream before its own recursion limit applies, in time
//! quadratic in the depth: 100,000 levels of `[[[[...` or `- - - - x` on one line cost 42 s of
//! CPU, and the 1 MiB file cap allows 500,000. No configuration is deeper than a handful of
//! levels, so text nested more than [`MAX_DEPTH`] levels is refused, naming the line.
//!
//! The scan follows YAML's structure closely enough to bound it, not to parse it: block
//! collections are counted by the columns they open (indentation, and compact `- `, `? `, `: `
//! and `key: ` on one line), flow collections by their brackets; brackets inside quoted
//! scalars, plain scalars (`help: GPU use [%]`), comments and block scalars (`|`, `>`) do not
//! count.

/// The deepest nesting accepted. The deepest real configuration (a web config's
/// `tls_server_config.cipher_suites` list) is three levels.
pub const MAX_DEPTH: usize = 64;

/// Text nested deeper than the limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: nested more than {limit} levels deep; refused")]
pub struct TooDeep {
    /// 1-based line where the limit is passed.
    pub line: usize,
    /// The limit.
    pub limit: usize,
}

/// Checks that `text` is nested at most `limit` levels deep. Linear in the length of `text`.
///
/// # Errors
/// [`TooDeep`] with the line where the limit is passed.
pub fn check(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut scan = Scan {
        blocks: Vec::new(),
        flow: 0,
        quote: None,
        block_scalar: None,
        limit,
    };
    for (i, line) in lines(text).enumerate() {
        scan.line(line)
            .map_err(|Deep| TooDeep { line: i + 1, limit })?;
    }
    Ok(())
}

/// YAML's lines: a line break is `\r\n`, `\n` or `\r`.
fn lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let t = rest?;
        match t.find(['\n', '\r']) {
            Some(i) => {
                let next = if t[i..].starts_with("\r\n") {
                    i + 2
                } else {
                    i + 1
                };
                rest = Some(&t[next..]);
                Some(&t[..i])
            }
            None => {
                rest = None;
                Some(t)
            }
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Seq,
    Map,
}

/// The limit was passed.
struct Deep;

struct Scan {
    /// The open block collections: column and kind.
    blocks: Vec<(usize, Kind)>,
    /// Open flow collections (`[`, `{`).
    flow: usize,
    /// Inside a quoted scalar (it may span lines): its quote.
    quote: Option<char>,
    /// Inside a block scalar: the indentation of the line that opened it.
    block_scalar: Option<usize>,
    limit: usize,
}

/// Whether `s` starts with the indicator `c` followed by a space, a tab or the end.
fn indicator(s: &str, c: char) -> bool {
    s.strip_prefix(c)
        .is_some_and(|r| r.is_empty() || r.starts_with([' ', '\t']))
}

/// Whether the plain text `s` is `key: ...` (a colon followed by a space, a tab or the end,
/// before any comment).
fn is_key(s: &str) -> bool {
    if s.starts_with(['[', '{', '|', '>', '#']) {
        return false;
    }
    let b = s.as_bytes();
    let mut i = 0;
    if let Some(q @ (b'"' | b'\'')) = b.first().copied() {
        // A quoted key: past its closing quote.
        i = 1;
        while i < b.len() && b[i] != q {
            i += if q == b'"' && b[i] == b'\\' { 2 } else { 1 };
        }
        i += 1;
    }
    while i < b.len() {
        match b[i] {
            b':' if matches!(b.get(i + 1), None | Some(b' ' | b'\t')) => return true,
            b'#' if i > 0 && matches!(b[i - 1], b' ' | b'\t') => return false,
            _ => {}
        }
        i += 1;
    }
    false
}

impl Scan {
    fn depth_ok(&self) -> Result<(), Deep> {
        if self.blocks.len() + self.flow > self.limit {
            Err(Deep)
        } else {
            Ok(())
        }
    }

    /// A block collection of `kind` at `col`: a new level unless it continues the one there.
    fn open(&mut self, col: usize, kind: Kind) -> Result<(), Deep> {
        match self.blocks.last().copied() {
            Some((c, k)) if c == col => {
                if k == Kind::Map && kind == Kind::Seq {
                    // A sequence at its mapping key's column (`key:\n- a`).
                    self.blocks.push((col, kind));
                } else if k == Kind::Seq && kind == Kind::Map {
                    // Back from such a sequence to its mapping's next key.
                    let n = self.blocks.len();
                    if n >= 2 && self.blocks[n - 2] == (col, Kind::Map) {
                        self.blocks.pop();
                    }
                }
            }
            _ => self.blocks.push((col, kind)),
        }
        self.depth_ok()
    }

    fn line(&mut self, line: &str) -> Result<(), Deep> {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let content = &line[indent..];
        if let Some(parent) = self.block_scalar {
            if content.trim().is_empty() || indent > parent {
                return Ok(());
            }
            self.block_scalar = None;
        }
        let mut rest = content;
        if self.quote.is_none() && self.flow == 0 {
            let body = content.trim_start();
            if body.is_empty() || body.starts_with('#') {
                return Ok(());
            }
            let marker = content.starts_with("---") || content.starts_with("...");
            if indent == 0 && marker && content[3..].chars().next().is_none_or(char::is_whitespace)
            {
                // A document marker: a new document starts at depth 0.
                self.blocks.clear();
                rest = content[3..].trim_start();
            } else {
                while self.blocks.last().is_some_and(|&(c, _)| c > indent) {
                    self.blocks.pop();
                }
                // The block indicators that open a collection on this line, each nested in the
                // one before (`- - - x`, `- key: v`, `? - a`).
                let mut col = indent;
                loop {
                    let seq = indicator(rest, '-');
                    if seq || indicator(rest, '?') || indicator(rest, ':') {
                        self.open(col, if seq { Kind::Seq } else { Kind::Map })?;
                        let after = rest[1..].trim_start_matches([' ', '\t']);
                        col += rest.len() - after.len();
                        rest = after;
                    } else {
                        if is_key(rest) {
                            self.open(col, Kind::Map)?;
                        }
                        break;
                    }
                }
            }
        }
        self.characters(rest, indent)
    }

    /// Flow brackets, quotes, comments and block scalar headers in the rest of a line.
    fn characters(&mut self, rest: &str, indent: usize) -> Result<(), Deep> {
        // The last character that is not a space, and whether a space came after it.
        let mut prev: Option<char> = None;
        let mut spaced = false;
        // The last token was an anchor or a tag (`&a`, `!!seq`): what follows it starts a node.
        let mut after_property = false;
        let mut chars = rest.char_indices().peekable();
        while let Some((i, c)) = chars.next() {
            if let Some(q) = self.quote {
                if q == '"' && c == '\\' {
                    chars.next();
                } else if c == q {
                    if q == '\'' && chars.peek().is_some_and(|&(_, n)| n == '\'') {
                        chars.next();
                    } else {
                        self.quote = None;
                        prev = Some(c);
                        spaced = false;
                    }
                }
                continue;
            }
            if c == ' ' || c == '\t' {
                spaced = true;
                continue;
            }
            let token_start = match prev {
                None => true,
                Some('[' | '{' | ',') => true,
                Some(':' | '-' | '?') => spaced,
                Some(_) => spaced && after_property,
            };
            if token_start {
                after_property = matches!(c, '&' | '!');
            }
            match c {
                '#' if prev.is_none() || spaced => return Ok(()),
                '"' | '\'' if token_start => self.quote = Some(c),
                '[' | '{' if token_start || self.flow > 0 => {
                    self.flow += 1;
                    self.depth_ok()?;
                }
                ']' | '}' if self.flow > 0 => self.flow -= 1,
                '|' | '>' if token_start && self.flow == 0 => {
                    // A header is the indicator, then chomping and indentation indicators.
                    let header = rest[i + 1..]
                        .trim_start_matches(|c: char| c == '+' || c == '-' || c.is_ascii_digit());
                    let header = header.trim_start_matches([' ', '\t']);
                    if header.is_empty() || header.starts_with('#') {
                        self.block_scalar = Some(indent);
                        return Ok(());
                    }
                }
                _ => {}
            }
            prev = Some(c);
            spaced = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        (0..=MAX_DEPTH)
            .find(|&limit| check(text, limit).is_ok())
            .unwrap_or(usize::MAX)
    }

    #[test]
    fn real_configurations_are_shallow() {
        let web = "tls_server_config:\n  cert_file: /x.crt\n  cipher_suites:\n    - TLS_AES_128_GCM_SHA256\n    - \"TLS_AES_256_GCM_SHA384\"\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\nbasic_auth_users:\n  alice: $2y$10$abc\n";
        assert_eq!(depth(web), 3);
        let v2 = "version: 2\nmetrics:\n  fields:\n  - name: DCGM_FI_DEV_GPU_TEMP\n    prometheusType: gauge\n    help: \"GPU [C], {x} # not a comment\"\n  - {name: X, prometheusType: gauge, help: 'it''s [%]'}\ncollections:\n  - name: scrape\n    every: 30s\n    metrics: { include: [\"*\"] }\n";
        assert_eq!(depth(v2), 5);
        // Brackets in plain and block scalars and comments are text.
        let text = "a: GPU use [%] {x}\nb: |\n  [[[[\n  - - - -\nc: >-\n  {{{{\n# [[[[\nd: [1, 2] # [[[[\n";
        assert_eq!(depth(text), 2);
        assert_eq!(depth("---\na:\n- b\n- c\nd: e\n---\nf: g\n"), 2);
    }

    #[test]
    fn deep_nesting_is_refused_at_its_line() {
        let flow = format!(
            "version: 2\nmetrics: {}{}\n",
            "[".repeat(65),
            "]".repeat(65)
        );
        assert_eq!(
            check(&flow, MAX_DEPTH),
            Err(TooDeep {
                line: 2,
                limit: MAX_DEPTH
            })
        );
        assert!(check(&format!("a: {}", "[".repeat(63)), MAX_DEPTH).is_ok());
        let dashes = format!("a: 1\n\n{}x\n", "- ".repeat(100));
        assert_eq!(check(&dashes, MAX_DEPTH).unwrap_err().line, 3);
        // Nested by indentation, one key per line; across lines of a flow collection; after
        // `\r` line breaks.
        let keys: String = (0..70)
            .map(|i| format!("{}k{i}:\n", " ".repeat(i)))
            .collect();
        assert_eq!(check(&keys, MAX_DEPTH).unwrap_err().line, 65);
        let lines = "[\n".repeat(70);
        assert_eq!(check(&lines, MAX_DEPTH).unwrap_err().line, 65);
        // Behind an anchor or a tag.
        let props = format!("a: &x !!seq {}", "[".repeat(64));
        assert_eq!(check(&props, MAX_DEPTH).unwrap_err().line, 1);
        assert!(check(&format!("a: &x !!seq {}", "[".repeat(63)), MAX_DEPTH).is_ok());
        let cr = format!("a: 1\r\rb: {}", "{".repeat(70));
        assert_eq!(check(&cr, MAX_DEPTH).unwrap_err().line, 3);
        // What the 1 MiB cap allows, at once.
        let huge = "[".repeat(1 << 20);
        assert_eq!(check(&huge, MAX_DEPTH).unwrap_err().line, 1);
        let huge = "- ".repeat(1 << 19);
        assert_eq!(check(&huge, MAX_DEPTH).unwrap_err().line, 1);
    }
}
