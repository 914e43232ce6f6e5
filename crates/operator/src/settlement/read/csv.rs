//! A CSV report read row by row (docs/settlement.md, "Bad input"): each
//! row numbered by the line it starts on, a quoted field allowed to hold a
//! line break, and a stray quote refusing its own line, never the refunds
//! below it.

use super::{NotAReport, Read1};
use jobfence_api::v1::{RefusedLine, SettlementReportLine};
use std::io::{BufRead, Read};

/// The most physical lines one CSV row may span (quoted fields may hold
/// line breaks, RFC 4180): past it, the quote that opened the row is taken
/// for a stray one.
const MAX_ROW_LINES: usize = 64;
/// The longest physical line read: a longer one (a file with no line ends,
/// the wrong file) is refused and skipped, never held whole. Above the
/// 256 KiB a line may carry to the coordinator, which refuses it there.
pub(super) const MAX_PHYSICAL_LINE: u64 = 1 << 20;

/// How one row's bytes split.
enum Split {
    /// A whole row: its fields, trimmed.
    Row(Vec<String>),
    /// A quoted field is still open at the end of the bytes.
    Open,
    /// Not a CSV row (why).
    Bad(String),
}

/// Reads a CSV report row by row, each numbered by the physical line it
/// starts on. A quoted field may run over line breaks; but a quote that
/// opens a row it does not close as a row of the header's columns (within
/// [`MAX_ROW_LINES`], and before the file ends) is taken for a stray `"`:
/// that line alone is refused, and the lines after it are read again as
/// rows of their own, so one stray quote never swallows the refunds below
/// it.
struct CsvRows {
    input: Box<dyn BufRead + Send>,
    /// Physical lines read ahead and given back, as [`CsvRows::physical`]
    /// gave them.
    pending: std::collections::VecDeque<Physical>,
    number: u64,
    /// The physical line [`CsvRows::physical`] read last (reused).
    line: Vec<u8>,
    split: Splitter,
}

/// One row as read: its first line's number, and its fields or why not.
type Row = (u64, Result<Vec<String>, String>);

/// One physical line given back: its number, and its bytes (without the
/// line end) or why it was not read.
type Physical = (u64, Result<Vec<u8>, String>);

impl CsvRows {
    fn new(input: Box<dyn BufRead + Send>) -> CsvRows {
        CsvRows {
            input,
            pending: Default::default(),
            number: 0,
            line: Vec::new(),
            split: Splitter {
                // Built (its state table made): `Default` leaves it unbuilt.
                reader: csv_core::Reader::new(),
                out: Vec::new(),
                ends: Vec::new(),
            },
        }
    }

    /// Reads the next physical line into `self.line`, without its line
    /// end: its number, and `Err` for a line longer than
    /// [`MAX_PHYSICAL_LINE`], skipped to its end.
    fn physical(&mut self) -> anyhow::Result<Option<(u64, Result<(), String>)>> {
        if let Some((n, l)) = self.pending.pop_front() {
            return Ok(Some((n, l.map(|l| self.line = l))));
        }
        let read = |input: &mut Box<dyn BufRead + Send>, raw: &mut Vec<u8>, limit: u64| {
            input.by_ref().take(limit).read_until(b'\n', raw)
        };
        let at = self.number;
        self.line.clear();
        let n = read(&mut self.input, &mut self.line, MAX_PHYSICAL_LINE + 1).map_err(|e| {
            // The file itself could not be read on (a cut gzip): the
            // import must not end as if the report ended here.
            anyhow::Error::new(e).context(format!("reading the report after line {at}"))
        })?;
        if n == 0 {
            return Ok(None);
        }
        self.number += 1;
        if !self.line.ends_with(b"\n") && n as u64 > MAX_PHYSICAL_LINE {
            // Skip to the line's end, a bounded piece at a time.
            loop {
                self.line.clear();
                let n = read(&mut self.input, &mut self.line, 1 << 16).map_err(|e| {
                    anyhow::Error::new(e)
                        .context(format!("reading the report in line {}", self.number))
                })?;
                if n == 0 || self.line.ends_with(b"\n") {
                    break;
                }
            }
            let why = format!("longer than {MAX_PHYSICAL_LINE} bytes (no line end?)");
            return Ok(Some((self.number, Err(why))));
        }
        if self.line.last() == Some(&b'\n') {
            self.line.pop();
        }
        // CRLF, and a stray CR before it (`\r\r\n`).
        while self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        if self.number == 1 && self.line.starts_with(b"\xef\xbb\xbf") {
            self.line.drain(..3);
        }
        Ok(Some((self.number, Ok(()))))
    }

    /// The next row; `columns`: the header's number of columns, once read.
    fn next(&mut self, columns: Option<usize>) -> anyhow::Result<Option<Row>> {
        let Some((first, line)) = self.physical()? else {
            return Ok(None);
        };
        if let Err(why) = line {
            return Ok(Some((first, Err(why))));
        }
        // The common row, on one line, split where it was read.
        match self.split.split(&self.line) {
            Split::Bad(why) => return Ok(Some((first, Err(why)))),
            Split::Row(fields) => return Ok(Some((first, Ok(fields)))),
            Split::Open => {}
        }
        let mut bytes = self.line.clone();
        let mut taken: Vec<Physical> = Vec::new();
        while taken.len() + 1 < MAX_ROW_LINES && (bytes.len() as u64) < MAX_PHYSICAL_LINE {
            match self.physical()? {
                Some((n, Ok(()))) => {
                    bytes.push(b'\n');
                    bytes.extend_from_slice(&self.line);
                    taken.push((n, Ok(self.line.clone())));
                }
                Some((n, Err(why))) => {
                    taken.push((n, Err(why)));
                    break;
                }
                None => break,
            }
            match self.split.split(&bytes) {
                Split::Open => continue,
                Split::Row(fields)
                    if columns.is_none_or(|c| fields.len() == c) && quoted_strictly(&bytes) =>
                {
                    return Ok(Some((first, Ok(fields))))
                }
                // A proper row that cannot be read (a byte that is not
                // UTF-8): refused whole, its lines not read again.
                Split::Bad(why) if quoted_strictly(&bytes) => return Ok(Some((first, Err(why)))),
                Split::Row(_) | Split::Bad(_) => break,
            }
        }
        // A stray quote: this line alone is refused, the ones it ran over
        // are read again as rows of their own.
        for l in taken.into_iter().rev() {
            self.pending.push_front(l);
        }
        let why =
            "a quote opened on this line closes no row of the header's columns (a stray '\"'?)";
        Ok(Some((first, Err(why.into()))))
    }
}

/// Splits a row's bytes into fields with a reader reused from row to row.
struct Splitter {
    reader: csv_core::Reader,
    out: Vec<u8>,
    ends: Vec<usize>,
}

impl Splitter {
    fn split(&mut self, row: &[u8]) -> Split {
        if row.is_empty() {
            // A blank line (the reader would skip its line end and ask
            // for more).
            return Split::Row(Vec::new());
        }
        self.reader.reset();
        // Unquoting only shortens a field, and a row holds at most one
        // field more than it has commas.
        let commas = row.iter().filter(|b| **b == b',').count();
        self.out.resize(row.len() + 1, 0);
        self.ends.resize(commas + 2, 0);
        let (mut input, mut nout, mut nends) = (row, 0, 0);
        // The row's line end, then the end of input: a quoted field still
        // open at the line end takes it in as text and asks for more.
        let mut rest: &[u8] = b"\n";
        loop {
            let (res, i, o, e) =
                self.reader
                    .read_record(input, &mut self.out[nout..], &mut self.ends[nends..]);
            (input, nout, nends) = (&input[i..], nout + o, nends + e);
            match res {
                csv_core::ReadRecordResult::InputEmpty if rest.is_empty() => return Split::Open,
                csv_core::ReadRecordResult::InputEmpty => (input, rest) = (rest, &[]),
                csv_core::ReadRecordResult::Record | csv_core::ReadRecordResult::End => break,
                csv_core::ReadRecordResult::OutputFull
                | csv_core::ReadRecordResult::OutputEndsFull => {
                    unreachable!("the buffers are sized for the row")
                }
            }
        }
        if !input.is_empty() || !rest.is_empty() {
            // Only the row's own line end ends it.
            return Split::Bad("a carriage return inside the line".into());
        }
        let _ = nout;
        let mut fields = Vec::with_capacity(nends);
        let mut from = 0;
        for &to in &self.ends[..nends] {
            match std::str::from_utf8(&self.out[from..to]) {
                Ok(f) => fields.push(f.trim().to_owned()),
                Err(_) => return Split::Bad("not UTF-8 text".into()),
            }
            from = to;
        }
        Split::Row(fields)
    }
}

/// Whether every quote of a row spanning lines stands where RFC 4180 puts
/// one: opening a field, doubled inside a quoted one, or closing it before
/// a comma, the row's end or blanks. A stray quote that happens to close
/// on a later line (`re_1,"abc` … `re_3,"k3",3`) leaves a closing quote
/// followed by text, and its row is refused. A one-line row is read as
/// leniently as ever (`"k9"x` is `k9x`).
fn quoted_strictly(row: &[u8]) -> bool {
    #[derive(Clone, Copy, PartialEq)]
    enum At {
        FieldStart,
        Unquoted,
        Quoted,
        QuoteInQuoted,
        AfterClose,
    }
    let mut at = At::FieldStart;
    for &b in row {
        at = match (at, b) {
            (At::FieldStart, b'"') => At::Quoted,
            (At::FieldStart | At::Unquoted | At::AfterClose, b',') => At::FieldStart,
            // A line break outside quotes ends a row: none is inside one.
            (At::FieldStart | At::Unquoted | At::AfterClose, b'\n') => return false,
            (At::FieldStart | At::Unquoted, _) => At::Unquoted,
            (At::Quoted, b'"') => At::QuoteInQuoted,
            (At::Quoted, _) => At::Quoted,
            (At::QuoteInQuoted, b'"') => At::Quoted,
            (At::QuoteInQuoted, b',') => At::FieldStart,
            (At::QuoteInQuoted | At::AfterClose, b' ' | b'\t') => At::AfterClose,
            (At::QuoteInQuoted | At::AfterClose, _) => return false,
        };
    }
    at != At::Quoted
}

/// A CSV report read row by row: its header row first (the first row
/// that is not blank), then each row, numbered by the line it starts on
/// in the file (blank lines are skipped but counted; CRLF or LF line ends;
/// a UTF-8 byte-order mark at the start is not part of the first column's
/// name).
pub(super) fn read_csv(
    input: Box<dyn BufRead + Send>,
    each: &mut dyn FnMut(Read1) -> bool,
) -> anyhow::Result<()> {
    let mut rows = CsvRows::new(input);
    let mut headers: Option<Vec<String>> = None;
    while let Some((number, fields)) = rows.next(headers.as_ref().map(Vec::len))? {
        let Some(headers) = &headers else {
            let fields = fields.map_err(|why| {
                NotAReport(format!(
                    "the report's header row (line {number}) cannot be read: {why}"
                ))
            })?;
            if fields.iter().all(String::is_empty) {
                continue;
            }
            if !each(Read1::Columns(fields.clone())) {
                return Ok(());
            }
            headers = Some(fields);
            continue;
        };
        let next = match fields {
            Ok(fields) if fields.iter().all(String::is_empty) => continue, // a blank line
            // More fields than columns: an unquoted comma (`1,234` for an
            // amount) would otherwise shift or drop a value unseen.
            Ok(fields) if fields.len() > headers.len() => Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason: format!(
                    "not a CSV row of the header's columns: {} fields, the header names {} (an \
                     unquoted comma in a field?)",
                    fields.len(),
                    headers.len()
                ),
            }),
            Ok(fields) => Read1::Line(SettlementReportLine {
                line: number,
                fields: headers.iter().cloned().zip(fields).collect(),
                // A header row naming a column twice is refused whole by
                // the coordinator (`columns.<field>`).
                unreadable: Default::default(),
            }),
            Err(why) => Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason: format!("not a CSV row: {why}"),
            }),
        };
        if !each(next) {
            return Ok(());
        }
    }
    if headers.is_none() {
        return Err(NotAReport(
            "the report has no header row (the file is empty): a CSV report starts with the \
             row naming its columns"
                .into(),
        )
        .into());
    }
    Ok(())
}
