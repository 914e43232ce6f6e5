//! A provider's report file read line by line, never whole: CSV (a header
//! row, then one refund per row) or JSON lines (one object per line, nested
//! objects flattened with dots: `metadata.operation_key`; a name given no
//! single value is sent as unreadable, see `jsonl.rs`), plain or gzip'd. What the coordinator receives is each line's number and its
//! columns as text; the coordinator reads them through the provider's
//! stored mapping. A line that cannot even be split into columns (a quote
//! not closed on its line, a JSON line that is not an object) is refused
//! here, with its number, and never sent; the lines after it are read as
//! usual.

use flate2::read::MultiGzDecoder;
use jobfence_api::v1::{RefusedLine, SettlementReportLine};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

mod csv;
mod jsonl;

/// How a report file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Comma-separated, with a header row naming the columns.
    Csv,
    /// One JSON object per line (Stripe's Refund objects, say).
    Jsonl,
}

impl Format {
    /// From a file name: `.csv`, `.jsonl`, `.ndjson`, `.json`, each
    /// possibly followed by `.gz`.
    pub fn of(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let name = name.strip_suffix(".gz").unwrap_or(&name);
        if name.ends_with(".csv") {
            Some(Format::Csv)
        } else if [".jsonl", ".ndjson", ".json"]
            .iter()
            .any(|e| name.ends_with(e))
        {
            Some(Format::Jsonl)
        } else {
            None
        }
    }
}

/// Opens `path` (`-`: standard input), unzipping it when it starts with
/// gzip's magic bytes.
fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead + Send>> {
    let raw: Box<dyn Read + Send> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        Box::new(File::open(path).map_err(|e| anyhow::anyhow!("opening {}: {e}", path.display()))?)
    };
    let mut buffered = BufReader::with_capacity(1 << 16, raw);
    let gzip = buffered.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(BufReader::with_capacity(
            1 << 16,
            MultiGzDecoder::new(buffered),
        ))
    } else {
        Box::new(buffered)
    })
}

/// A file that is no report at all (a CSV file with no header row): the
/// import is refused whole, not "cut off".
#[derive(Debug)]
pub struct NotAReport(pub String);

impl std::fmt::Display for NotAReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotAReport {}

/// When lines were read and every one of them was refused here (`refused`
/// holds them all, and none was sent), why the file is no report: the
/// coordinator would otherwise see a report with no line, which
/// `--allow-empty` takes. `None` when nothing was refused (an empty file).
pub fn all_refused(refused: &[RefusedLine]) -> Option<NotAReport> {
    let first = refused.first()?;
    let more = match refused.len() {
        1 => String::new(),
        n => format!(", and {} more", n - 1),
    };
    Some(NotAReport(format!(
        "every one of the report's {} lines was refused (line {}: {}: {}{more}): a report whose \
         lines are all refused is no report with no line, and covers nothing, --allow-empty or \
         not",
        refused.len(),
        first.line,
        first.field,
        first.reason
    )))
}

/// One line as read: sent, or refused here; or, first, the columns a CSV
/// report's header row names.
pub enum Read1 {
    Columns(Vec<String>),
    Line(SettlementReportLine),
    Refused(RefusedLine),
}

/// Calls `each` with every line of the file, in order; stops early when it
/// returns false.
pub fn read(
    path: &Path,
    format: Format,
    mut each: impl FnMut(Read1) -> bool,
) -> anyhow::Result<()> {
    let input = open(path)?;
    match format {
        Format::Csv => csv::read_csv(input, &mut each),
        Format::Jsonl => jsonl::read_jsonl(input, &mut each),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::io::Write;

    /// A line read: its number and columns, or its number and why refused.
    type Got = Result<(u64, HashMap<String, String>), (u64, String)>;

    fn lines(bytes: &[u8], format: Format) -> Vec<Got> {
        let dir = std::env::temp_dir().join(format!("jobfence-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("report-{}", fastrand_name()));
        std::fs::File::create(&path)
            .unwrap()
            .write_all(bytes)
            .unwrap();
        let (out, _) = read_all(&path, format).unwrap();
        std::fs::remove_file(&path).unwrap();
        out
    }

    /// The lines of the file at `path`, and the columns read first.
    fn read_all(path: &Path, format: Format) -> anyhow::Result<(Vec<Got>, Vec<Vec<String>>)> {
        let (mut out, mut columns) = (Vec::new(), Vec::new());
        read(path, format, |l| {
            match l {
                Read1::Line(l) => out.push(Ok((l.line, l.fields))),
                Read1::Refused(r) => out.push(Err((r.line, r.reason))),
                Read1::Columns(c) => {
                    assert!(out.is_empty(), "the columns come before every line");
                    columns.push(c)
                }
            }
            true
        })?;
        Ok((out, columns))
    }

    #[test]
    fn a_csv_reports_header_row_goes_first_and_an_empty_file_has_none() {
        let dir = std::env::temp_dir().join(format!("jobfence-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("header-{}", fastrand_name()));
        std::fs::write(&path, b"id,amount\r\n").unwrap();
        let (lines, columns) = read_all(&path, Format::Csv).unwrap();
        assert!(lines.is_empty());
        assert_eq!(columns, vec![vec!["id".to_string(), "amount".to_string()]]);
        std::fs::write(&path, b"").unwrap();
        let empty = read_all(&path, Format::Csv).unwrap_err().to_string();
        assert!(empty.contains("no header row"), "{empty}");
        std::fs::write(&path, b"").unwrap();
        let (lines, columns) = read_all(&path, Format::Jsonl).unwrap();
        assert!(
            lines.is_empty() && columns.is_empty(),
            "JSON lines have no header row"
        );
        std::fs::remove_file(&path).unwrap();
    }

    fn fastrand_name() -> String {
        format!("{:?}", std::time::SystemTime::now())
            .chars()
            .filter(char::is_ascii_digit)
            .collect()
    }

    #[test]
    fn a_messy_csv_reads_with_its_line_numbers() {
        let file = b"\xef\xbb\xbfid,merchant_reference,amount\r\nre_1,\"key, with comma\",\"1,234\"\r\n\r\nre_2,k2,5\r\n";
        let got = lines(file, Format::Csv);
        assert_eq!(got.len(), 2, "{got:?}");
        let (n, first) = got[0].clone().unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            first["id"], "re_1",
            "the BOM is not part of the first column's name"
        );
        assert_eq!(first["merchant_reference"], "key, with comma");
        assert_eq!(first["amount"], "1,234");
        assert_eq!(got[1].clone().unwrap().0, 4);
        let lf = lines(b"id,amount\nre_1,5\n\n\nre_2,6", Format::Csv);
        let numbers: Vec<u64> = lf.iter().map(|l| l.clone().unwrap().0).collect();
        assert_eq!(
            numbers,
            [2, 5],
            "LF line ends, blank lines, no final line end"
        );
    }

    /// A quoted field may hold a line break (RFC 4180): the row is read
    /// whole, numbered by the line it starts on.
    #[test]
    fn a_quoted_line_break_is_part_of_its_field() {
        let file = b"id,merchant_reference,amount\r\nre_1,\"two\r\nlines\",5\r\n\r\nre_2,\"a \"\"b\"\"\",6\r\n";
        let got = lines(file, Format::Csv);
        let read: Vec<(u64, String)> = got
            .iter()
            .map(|l| l.clone().unwrap())
            .map(|(n, f)| (n, f["merchant_reference"].clone()))
            .collect();
        assert_eq!(
            read,
            [(2, "two\nlines".to_owned()), (5, "a \"b\"".to_owned())]
        );
    }

    /// A row with more fields than the header names (an unquoted comma)
    /// is refused; a row whose quoted field spans lines and holds a byte
    /// that is not UTF-8 is refused whole, its lines not read as rows; a
    /// line of a lone CR before its line end is blank.
    #[test]
    fn rows_that_cannot_be_read_are_refused_whole() {
        let file =
            b"id,ref,amount\nre_0,k0,1,234\nre_1,\"caf\xe9\nre_2,k2,2\nx\",1\n\r\r\nre_3,k3,3\n";
        let got = lines(file, Format::Csv);
        let numbers: Vec<Result<u64, u64>> = got
            .iter()
            .map(|l| l.clone().map(|(n, _)| n).map_err(|(n, _)| n))
            .collect();
        assert_eq!(numbers, [Err(2), Err(3), Ok(7)], "{got:?}");
        assert!(got[0].clone().unwrap_err().1.contains("unquoted comma"));
        assert!(got[1].clone().unwrap_err().1.contains("UTF-8"), "{got:?}");
    }

    /// A line far longer than any report's is refused and skipped, never
    /// held whole; the next line is read.
    #[test]
    fn a_line_with_no_end_in_sight_is_refused_and_skipped() {
        let mut file = b"id,amount\nre_".to_vec();
        file.extend(std::iter::repeat_n(
            b'x',
            (csv::MAX_PHYSICAL_LINE + 10) as usize,
        ));
        file.extend_from_slice(b",5\nre_2,6\n");
        let got = lines(&file, Format::Csv);
        assert_eq!(got[0].clone().unwrap_err().0, 2);
        assert_eq!(got[1].clone().unwrap().0, 3);
    }

    /// A quote left open refuses its own line, named by its number, and
    /// the lines after it are read as rows of their own, even where a
    /// later quote would close it into a row of the header's columns: a
    /// reader of whole records swallowed them.
    #[test]
    fn a_stray_quote_refuses_its_line_alone() {
        let file = b"id,merchant_reference,amount\nre_q1,\"unterminated,1\nre_q2,k2,2\nre_q3,\"k3\",3\nre_q4,27\" monitor,4\nre_q5,\"open,5\n";
        let got = lines(file, Format::Csv);
        let refused: Vec<u64> = got
            .iter()
            .filter_map(|l| l.clone().err())
            .map(|r| r.0)
            .collect();
        assert_eq!(refused, [2, 6], "{got:?}");
        assert!(got[0].clone().unwrap_err().1.contains("quote"), "{got:?}");
        let read: Vec<(u64, String)> = got
            .iter()
            .filter_map(|l| l.clone().ok())
            .map(|(n, f)| (n, f["merchant_reference"].clone()))
            .collect();
        assert_eq!(
            read,
            [
                (3, "k2".to_owned()),
                (4, "k3".to_owned()),
                (5, "27\" monitor".to_owned())
            ],
            "a quote inside an unquoted field is a character of it"
        );
    }

    #[test]
    fn json_lines_flatten_and_bad_lines_are_refused_with_their_number() {
        let file = b"{\"id\":\"re_1\",\"amount\":1000,\"metadata\":{\"operation_key\":\"k\"},\"reason\":null}\n\nnot json\n[1]\n{\"id\":\"re_\xff\"}\n";
        let got = lines(file, Format::Jsonl);
        let (n, first) = got[0].clone().unwrap();
        assert_eq!(n, 1);
        assert_eq!(first["metadata.operation_key"], "k");
        assert_eq!(first["amount"], "1000");
        assert!(!first.contains_key("reason"));
        assert_eq!(got[1].clone().unwrap_err().0, 3);
        assert_eq!(got[2].clone().unwrap_err().0, 4);
        assert_eq!(got[3].clone().unwrap_err(), (5, "not UTF-8 text".into()));
    }

    #[test]
    fn a_report_cut_short_is_an_error_not_its_end() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        for i in 0..2000 {
            writeln!(gz, "re_{i},{i}").unwrap();
        }
        let whole = gz.finish().unwrap();
        let dir = std::env::temp_dir().join(format!("jobfence-read-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("cut-{}", fastrand_name()));
        std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
        for format in [Format::Csv, Format::Jsonl] {
            let mut seen = 0;
            let read = read(&path, format, |_| {
                seen += 1;
                true
            });
            assert!(
                read.is_err(),
                "{format:?}: ended cleanly after {seen} lines"
            );
        }
    }

    #[test]
    fn a_gzipped_report_is_read_as_plain() {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"id,amount\nre_1,5\n").unwrap();
        let got = lines(&gz.finish().unwrap(), Format::Csv);
        assert_eq!(got[0].clone().unwrap().1["id"], "re_1");
    }
}
