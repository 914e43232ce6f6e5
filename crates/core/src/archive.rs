//! The pruner's archive file (`--prune-archive-dir`; docs/operating.md,
//! "Retention"): one gzip-compressed JSON-lines file per pruning run and
//! database, `jobfence-prune-<UTC timestamp>-<schema>.jsonl.gz`, written
//! as `….partial` and renamed when the run ends (`-2`, `-3`, … before
//! `.jsonl.gz` when another run of the same millisecond took the name). Each batch's lines (see
//! `jobfence_store::archive` for their format) are compressed, flushed
//! (a gzip sync flush) and fsynced before the batch's transaction
//! commits, so a row is never deleted without being on disk. The file is
//! created at the first batch: a run that prunes nothing leaves none.

use flate2::write::GzEncoder;
use flate2::Compression;
use jobfence_store::archive::PruneArchive;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// One run's archive of one database (see the module docs).
pub struct ArchiveFile {
    dir: PathBuf,
    schema: String,
    started: SystemTime,
    state: Mutex<State>,
}

enum State {
    /// Nothing written yet: no file.
    Unopened,
    Open {
        gz: GzEncoder<Counting>,
        partial: PathBuf,
    },
    /// A write failed: the partial file is left as it is.
    Failed(PathBuf),
}

/// A file that counts the bytes written to it.
struct Counting {
    file: File,
    bytes: u64,
}

impl Write for Counting {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.file.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl ArchiveFile {
    /// The archive of a run starting now on database schema `schema`,
    /// into directory `dir` (created at the first write if missing).
    pub fn new(dir: &Path, schema: &str) -> Self {
        ArchiveFile {
            dir: dir.to_path_buf(),
            schema: schema.to_string(),
            started: SystemTime::now(),
            state: Mutex::new(State::Unopened),
        }
    }

    fn open(&self) -> io::Result<(GzEncoder<Counting>, PathBuf)> {
        std::fs::create_dir_all(&self.dir)?;
        // 2026-12-01T20:57:31.123Z → 20261201T205731.123Z
        let stamp: String = humantime::format_rfc3339_millis(self.started)
            .to_string()
            .chars()
            .filter(|c| *c != '-' && *c != ':')
            .collect();
        let schema: String = self
            .schema
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        for n in 1u32.. {
            let suffix = if n == 1 {
                String::new()
            } else {
                format!("-{n}")
            };
            let name = format!("jobfence-prune-{stamp}-{schema}{suffix}.jsonl.gz.partial");
            let path = self.dir.join(name);
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                // Another run that started in the same millisecond (two
                // coordinators on one database, both held up by the same
                // failover) may have ended already: its file, renamed
                // without `.partial`, would be replaced by this one's at
                // its end. The name is taken then. (It renamed before this
                // `.partial` was created, which `create_new` refused while
                // the other's existed, so the check is not too early.)
                Ok(_) if path.with_extension("").exists() => {
                    std::fs::remove_file(&path)?;
                    continue;
                }
                Ok(file) => {
                    let gz = GzEncoder::new(Counting { file, bytes: 0 }, Compression::default());
                    return Ok((gz, path));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        unreachable!("some suffix is free")
    }

    /// Ends the run's file: writes the gzip trailer, fsyncs it, renames it
    /// without `.partial` and fsyncs the directory. Its path, or `None`
    /// when nothing was archived. After a failed write, the error names
    /// the `.partial` file left behind (the lines of the batches that
    /// committed before the failure are in it).
    pub fn finish(self) -> Result<Option<PathBuf>, String> {
        let state = self
            .state
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match state {
            State::Unopened => Ok(None),
            State::Failed(partial) => Err(format!(
                "a write to the archive failed; {} left as it was",
                partial.display()
            )),
            State::Open { gz, partial } => {
                let done = partial.with_extension("");
                let end = |gz: GzEncoder<Counting>| -> io::Result<()> {
                    let counting = gz.finish()?;
                    counting.file.sync_all()?;
                    std::fs::rename(&partial, &done)?;
                    File::open(&self.dir)?.sync_all()
                };
                end(gz).map_err(|e| format!("ending the archive {}: {e}", partial.display()))?;
                Ok(Some(done))
            }
        }
    }
}

impl PruneArchive for ArchiveFile {
    fn write_batch(&self, lines: &[Vec<u8>]) -> Result<u64, String> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if matches!(*state, State::Unopened) {
            let (gz, partial) = self
                .open()
                .map_err(|e| format!("creating an archive file in {}: {e}", self.dir.display()))?;
            *state = State::Open { gz, partial };
        }
        let State::Open { gz, partial } = &mut *state else {
            return Err("an earlier write to the archive failed".into());
        };
        let before = gz.get_ref().bytes;
        let mut write = || -> io::Result<()> {
            for line in lines {
                gz.write_all(line)?;
                gz.write_all(b"\n")?;
            }
            // A sync flush: every line so far can be decompressed from
            // what is on disk, then the file's data is fsynced.
            gz.flush()?;
            gz.get_ref().file.sync_data()
        };
        match write() {
            Ok(()) => Ok(gz.get_ref().bytes - before),
            Err(e) => {
                let why = format!("writing the archive {}: {e}", partial.display());
                let failed = partial.clone();
                *state = State::Failed(failed);
                Err(why)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(path: &Path) -> Vec<String> {
        use std::io::{BufRead, BufReader};
        let file = File::open(path).unwrap();
        BufReader::new(flate2::read::GzDecoder::new(file))
            .lines()
            .map(Result::unwrap)
            .collect()
    }

    /// Two runs that started in the same millisecond on one schema (two
    /// coordinators held up by the same failover), the second opening its
    /// file after the first ended: each keeps a file of its own, and the
    /// second's end replaces nothing.
    #[test]
    fn runs_started_in_the_same_millisecond_keep_a_file_each() {
        let dir =
            std::env::temp_dir().join(format!("jobfence-archive-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let started = SystemTime::now();
        let run = |line: &str| {
            let archive = ArchiveFile {
                started,
                ..ArchiveFile::new(&dir, "jobs_db")
            };
            archive.write_batch(&[line.as_bytes().to_vec()]).unwrap();
            archive.finish().unwrap().unwrap()
        };
        let first = run("{\"job\":{\"id\":1}}");
        let second = run("{\"job\":{\"id\":2}}");
        assert_ne!(first, second);
        assert_eq!(lines_of(&first), ["{\"job\":{\"id\":1}}"]);
        assert_eq!(lines_of(&second), ["{\"job\":{\"id\":2}}"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
