//! A provider's report file read line by line, never whole: CSV (a header
//! row, then one refund per row) or JSON lines (one object per line, nested
//! objects flattened with dots: `metadata.operation_key`), plain or
//! gzip'd. What the coordinator receives is each line's number and its
//! columns as text; the coordinator reads them through the provider's
//! stored mapping. A line that cannot even be split into columns (a broken
//! quote, a JSON line that is not an object) is refused here, with its
//! number, and never sent.

use flate2::read::MultiGzDecoder;
use jobfence_api::v1::{RefusedLine, SettlementReportLine};
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

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
        Format::Csv => read_csv(input, &mut each),
        Format::Jsonl => read_jsonl(input, &mut each),
    }
}

/// A reader that notes where each line ends, so that a CSV record's line
/// number can be told from its byte offset (the csv reader's own count
/// goes wrong with CRLF line ends and blank lines).
struct NewlineNotes<R> {
    inner: R,
    offset: u64,
    ends: std::rc::Rc<std::cell::RefCell<std::collections::VecDeque<u64>>>,
}

impl<R: Read> Read for NewlineNotes<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let mut ends = self.ends.borrow_mut();
        for (i, b) in buf[..n].iter().enumerate() {
            if *b == b'\n' {
                ends.push_back(self.offset + i as u64);
            }
        }
        self.offset += n as u64;
        Ok(n)
    }
}

fn read_csv(
    mut input: Box<dyn BufRead + Send>,
    each: &mut dyn FnMut(Read1) -> bool,
) -> anyhow::Result<()> {
    // A UTF-8 byte-order mark goes before the csv reader sees it (the
    // byte offsets it reports then match the file's lines).
    if input.fill_buf()?.starts_with(b"\xef\xbb\xbf") {
        input.consume(3);
    }
    let ends = std::rc::Rc::new(std::cell::RefCell::new(std::collections::VecDeque::new()));
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .trim(csv::Trim::All)
        .from_reader(NewlineNotes {
            inner: input,
            offset: 0,
            ends: ends.clone(),
        });
    let headers = reader.headers()?.clone();
    if headers.iter().all(str::is_empty) {
        anyhow::bail!(
            "the report has no header row (the file is empty): a CSV report starts with the \
             row naming its columns"
        );
    }
    if !each(Read1::Columns(headers.iter().map(str::to_owned).collect())) {
        return Ok(());
    }
    let mut line = 1u64;
    let mut line_at = |byte: u64| {
        let mut ends = ends.borrow_mut();
        while ends.front().is_some_and(|&e| e < byte) {
            ends.pop_front();
            line += 1;
        }
        line
    };
    let mut record = csv::StringRecord::new();
    loop {
        let next = match reader.read_record(&mut record) {
            Ok(false) => return Ok(()),
            Ok(true) => {
                // Where the parser stopped, just past the record: its own
                // line end is the last byte before (LF) or the next (CRLF),
                // and every line end before that is a line above it.
                let number = line_at(reader.position().byte().saturating_sub(1));
                let fields: HashMap<String, String> = headers
                    .iter()
                    .zip(record.iter())
                    .map(|(h, v)| (h.to_owned(), v.to_owned()))
                    .collect();
                if fields.values().all(|v| v.is_empty()) {
                    continue; // a blank line
                }
                Read1::Line(SettlementReportLine {
                    line: number,
                    fields,
                })
            }
            // The file itself could not be read on (a cut gzip): the
            // import must not end as if the report ended here.
            Err(e) if matches!(e.kind(), csv::ErrorKind::Io(_)) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "reading the report after line {}",
                    line_at(reader.position().byte())
                )))
            }
            Err(e) => Read1::Refused(RefusedLine {
                line: line_at(reader.position().byte().saturating_sub(1)),
                field: "line".into(),
                reason: format!("not a CSV row: {e}"),
            }),
        };
        if !each(next) {
            return Ok(());
        }
    }
}

fn read_jsonl(
    input: Box<dyn BufRead + Send>,
    each: &mut dyn FnMut(Read1) -> bool,
) -> anyhow::Result<()> {
    for (i, line) in input.split(b'\n').enumerate() {
        let number = i as u64 + 1;
        let line = line.map_err(|e| {
            anyhow::Error::new(e).context(format!("reading the report after line {}", number - 1))
        })?;
        let Ok(line) = String::from_utf8(line) else {
            if !each(Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason: "not UTF-8 text".into(),
            })) {
                break;
            }
            continue;
        };
        let text = line.trim_start_matches('\u{feff}').trim();
        if text.is_empty() {
            continue;
        }
        let next = match serde_json::from_str::<serde_json::Value>(text) {
            Ok(serde_json::Value::Object(map)) => {
                let mut fields = HashMap::new();
                flatten("", &serde_json::Value::Object(map), &mut fields);
                Read1::Line(SettlementReportLine {
                    line: number,
                    fields,
                })
            }
            Ok(_) => Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason: "not a JSON object".into(),
            }),
            Err(e) => Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason: format!("not JSON: {e}"),
            }),
        };
        if !each(next) {
            break;
        }
    }
    Ok(())
}

/// A JSON value's scalars, named by their dotted paths; nulls left out.
fn flatten(prefix: &str, v: &serde_json::Value, out: &mut HashMap<String, String>) {
    let name = |k: &str| {
        if prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                flatten(&name(k), v, out);
            }
        }
        serde_json::Value::Null => {}
        serde_json::Value::String(s) => {
            out.insert(prefix.to_owned(), s.clone());
        }
        other => {
            out.insert(prefix.to_owned(), other.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
