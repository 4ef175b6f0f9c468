//! The records of a metrics CSV in the dialect dcgm-exporter reads: Go's `encoding/csv` with
//! `Comment = '#'` and `TrimLeadingSpace = true`.
//!
//! The `csv` crate reads the records: fields split at commas, double-quoted fields (which may
//! hold commas, line breaks and `""` for a quote), `#` comment lines, blank lines skipped, LF or
//! CRLF line ends. Two things Go does are not options of the `csv` crate, and [`normalise`]
//! bridges them before it reads:
//!
//! - Go skips the blanks before a field, so `a, "b, c"` is two fields; the `csv` crate only opens
//!   a quoted field at its first byte. The blanks around fields outside quotes are dropped (a
//!   field's own blanks are not data in this format: dcgm-exporter trims every field too).
//! - Go refuses a `"` inside an unquoted field, text after a closing quote and a quote never
//!   closed; the `csv` crate reads all three leniently. They are errors naming the line.
//!
//! As before, a line whose first non-blank character is `#` is a comment (Go requires the `#` in
//! the first column; an indented comment is accepted here rather than refused), a line of blanks
//! is skipped, and a UTF-8 byte-order mark at the start is ignored.

/// A syntax error: the 1-based line and what is wrong.
pub(super) type SyntaxError = (u64, String);

/// Reads the records of `text`, each with the 1-based line it starts on.
///
/// # Errors
/// The first syntax error, with its line.
pub(super) fn records(text: &str) -> Result<Vec<(u64, Vec<String>)>, SyntaxError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let (normal, starts) = normalise(text)?;
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(normal.as_bytes());
    let mut out = Vec::with_capacity(starts.len());
    for (i, record) in reader.records().enumerate() {
        // `normalise` found the same record starts the reader does; the reader's own position
        // is where it began looking (before skipped comments and blank lines), not the record.
        let line = starts.get(i).copied().unwrap_or_else(|| {
            record
                .as_ref()
                .ok()
                .and_then(|r| r.position())
                .map_or(0, csv::Position::line)
        });
        let record = record.map_err(|e| (line, e.to_string()))?;
        out.push((line, record.iter().map(str::to_owned).collect()));
    }
    Ok(out)
}

/// Where [`normalise`] is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// At the start of a line, outside quotes.
    LineStart,
    /// After a comma, outside quotes.
    FieldStart,
    /// In a comment line.
    Comment,
    /// In a field that did not start with a quote.
    Unquoted,
    /// Inside a quoted field.
    Quoted,
    /// After the closing quote of a field.
    AfterQuote,
}

/// Drops the blanks around fields outside quotes (and the indentation of comment lines), and
/// checks the quoting as Go does. Returns the text for the `csv` crate and the line each record
/// starts on.
fn normalise(text: &str) -> Result<(String, Vec<u64>), SyntaxError> {
    let mut out = String::with_capacity(text.len());
    let mut starts = Vec::new();
    // Blanks inside an unquoted field, kept only if more of the field follows.
    let mut held = String::new();
    let mut line: u64 = 1;
    let mut quote_line = 0;
    let mut at = At::LineStart;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        let end = c == '\n' || c == '\r';
        let blank = !end && c.is_whitespace();
        match at {
            At::LineStart | At::FieldStart if blank => {}
            At::LineStart | At::FieldStart => {
                if at == At::LineStart && !end && c != '#' {
                    starts.push(line);
                }
                at = match c {
                    '#' if at == At::LineStart => At::Comment,
                    '"' => {
                        quote_line = line;
                        At::Quoted
                    }
                    ',' => At::FieldStart,
                    _ if end => At::LineStart,
                    _ => At::Unquoted,
                };
                out.push(c);
            }
            // The `csv` crate ends a comment at a line feed only.
            At::Comment => {
                out.push(c);
                if c == '\n' {
                    at = At::LineStart;
                }
            }
            At::Unquoted => match c {
                '"' => return Err((line, "bare \" in a non-quoted field".to_owned())),
                _ if blank => held.push(c),
                _ => {
                    if end || c == ',' {
                        at = if end { At::LineStart } else { At::FieldStart };
                    } else {
                        out.push_str(&held);
                    }
                    held.clear();
                    out.push(c);
                }
            },
            At::Quoted => {
                out.push(c);
                if c == '"' {
                    if chars.peek() == Some(&'"') {
                        chars.next();
                        out.push('"');
                    } else {
                        at = At::AfterQuote;
                    }
                }
            }
            At::AfterQuote => match c {
                _ if blank => {}
                ',' => {
                    at = At::FieldStart;
                    out.push(c);
                }
                _ if end => {
                    at = At::LineStart;
                    out.push(c);
                }
                _ => return Err((line, format!("unexpected {c:?} after a closing quote"))),
            },
        }
        if c == '\n' {
            line += 1;
        }
    }
    if at == At::Quoted {
        return Err((quote_line, "unterminated quoted field".to_owned()));
    }
    Ok((out, starts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Vec<(u64, Vec<String>)> {
        records(text).unwrap()
    }

    fn row(line: u64, f: &[&str]) -> (u64, Vec<String>) {
        (line, f.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn blanks_around_fields_go_and_quotes_open_after_them() {
        assert_eq!(
            fields("  a ,\tb c , \"d, \"\"e\"\" \"  \n"),
            vec![row(1, &["a", "b c", "d, \"e\" "])]
        );
    }

    #[test]
    fn comments_blank_lines_and_crlf_keep_the_line_numbers() {
        let text = "# a \"quoted\", comment\r\n\r\n   \n  # indented\nx,y,z\r\n\n# c\nu,v,w";
        assert_eq!(
            fields(text),
            vec![row(5, &["x", "y", "z"]), row(8, &["u", "v", "w"])]
        );
    }

    #[test]
    fn a_quoted_field_may_span_lines_and_hold_a_hash() {
        assert_eq!(
            fields("a,b,\"one\n# two\"\nc,d,e\n"),
            vec![row(1, &["a", "b", "one\n# two"]), row(3, &["c", "d", "e"])]
        );
    }

    #[test]
    fn a_byte_order_mark_is_not_part_of_the_first_field() {
        assert_eq!(fields("\u{feff}a,b,c\n"), vec![row(1, &["a", "b", "c"])]);
        assert_eq!(
            fields("\u{feff}\"a\",b,c\n"),
            vec![row(1, &["a", "b", "c"])]
        );
    }

    #[test]
    fn go_quoting_errors_name_their_line() {
        assert_eq!(
            records("ok,ok,ok\na,b\"c,d\n").unwrap_err(),
            (2, "bare \" in a non-quoted field".to_owned())
        );
        assert_eq!(
            records("a,\"b\"c,d\n").unwrap_err(),
            (1, "unexpected 'c' after a closing quote".to_owned())
        );
        assert_eq!(
            records("a,b,c\na,b,\"open\n\n").unwrap_err(),
            (2, "unterminated quoted field".to_owned())
        );
    }

    #[test]
    fn empty_fields_are_kept() {
        assert_eq!(fields(",\n"), vec![row(1, &["", ""])]);
        assert_eq!(fields("a, ,\"\"\n"), vec![row(1, &["a", "", ""])]);
    }
}
