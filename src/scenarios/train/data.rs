//! WikiText-2 (raw) fine-tuning data, grouped like HF `run_clm.py`:
//!
//! 1. the text loader (`datasets` "text", `keep_linebreaks=True`): one example per line, line
//!    break kept (Python `str.splitlines(keepends=True)`);
//! 2. each line tokenized on its own, no special tokens;
//! 3. `group_texts`, mapped with `batched=True` (1000 examples at a time): each chunk of 1000
//!    lines is concatenated, cut to a multiple of `block_size` (the remainder of *each chunk*
//!    is dropped) and split into blocks; labels = inputs (the loss shifts them).
//!
//! The train split (`wiki.train.raw`) is not shipped: our own runs train on `wiki.valid.raw`
//! and evaluate on `wiki.test.raw`, and the log header says so.

use crate::data::Archive;
use crate::error::{Error, Result};
use crate::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

/// `--data full`: wikitext-2-raw-v1.zip (CC BY-SA 3.0) from Stephen Merity's mirror (the
/// original S3 bucket answers 403), the archive and each member checked against the
/// checksums of the original archive (/work/shared/data/wikitext-2-raw/SOURCE.md).
pub const WIKITEXT2_RAW: Archive<'static> = Archive {
    name: "wikitext-2-raw-v1.zip",
    dir: "wikitext-2-raw",
    url: "https://wikitext.smerity.com/wikitext-2-raw-v1.zip",
    sha256: "ef7edb566e3e2b2d31b29c1fdb0c89a4cc683597484c3dc2517919c615435a11",
    members: &[
        (
            "wikitext-2-raw/wiki.train.raw",
            "6707892fa3788b5ab9ed78ab5ff37d9fe825f6011a2ad4fcd6a6d467f0e7da57",
        ),
        (
            "wikitext-2-raw/wiki.valid.raw",
            "4cd0f6876d07a413aa911261ff6d363c72d757d47f0fdd6015702014c89cb9c7",
        ),
        (
            "wikitext-2-raw/wiki.test.raw",
            "173c87a53759e0201f33e0ccf978e510c2042d7f2cb78229d9a50d79b9e7dd08",
        ),
    ],
    // A folder without the train split is used as --data DIR is (train on valid, eval on test).
    required: &["wiki.valid.raw", "wiki.test.raw"],
    hint: "put wiki.train.raw, wiki.valid.raw and wiki.test.raw (wikitext-2-raw-v1) in a folder wikitext-2-raw/ there, or pass --data DIR",
};

/// `datasets.Dataset.map(batched=True)`'s default batch size, which `group_texts` inherits.
pub const MAP_BATCH_LINES: usize = 1000;

/// The built-in sample: the first lines of each file (CC BY-SA 3.0, see data/README.md).
pub const SAMPLE_TRAIN: &str = include_str!("../../../data/wikitext2_sample/wiki.valid.raw");
pub const SAMPLE_EVAL: &str = include_str!("../../../data/wikitext2_sample/wiki.test.raw");

/// Python `str.splitlines(keepends=True)`.
pub fn split_lines_keepends(text: &str) -> Vec<&str> {
    const BREAKS: &[char] = &[
        '\n', '\r', '\u{b}', '\u{c}', '\u{1c}', '\u{1d}', '\u{1e}', '\u{85}', '\u{2028}',
        '\u{2029}',
    ];
    let mut lines = vec![];
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if BREAKS.contains(&c) {
            let mut end = i + c.len_utf8();
            if c == '\r' {
                if let Some(&(j, '\n')) = chars.peek() {
                    end = j + 1;
                    chars.next();
                }
            }
            lines.push(&text[start..end]);
            start = end;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// `group_texts` over tokenized lines: blocks of `block_size` token ids.
pub fn group_texts(lines: &[Vec<u32>], block_size: usize) -> Vec<Vec<u32>> {
    let mut blocks = vec![];
    for chunk in lines.chunks(MAP_BATCH_LINES) {
        let all: Vec<u32> = chunk.iter().flatten().copied().collect();
        blocks.extend(all.chunks_exact(block_size).map(|b| b.to_vec()));
    }
    blocks
}

/// Tokenize (line by line) and group one split's text.
pub fn blocks(text: &str, tok: &TextTokenizer, block_size: usize) -> Result<Vec<Vec<u32>>> {
    let lines = split_lines_keepends(text)
        .into_iter()
        .map(|l| tok.encode(l))
        .collect::<Result<Vec<_>>>()?;
    Ok(group_texts(&lines, block_size))
}

/// One split: where it came from and its text.
#[derive(Clone, Debug)]
pub struct TextSplit {
    /// Path, or `embedded:NAME`.
    pub origin: String,
    pub text: String,
}

/// Train and eval text: the built-in sample, a directory holding `wiki.{train,valid,test}.raw`
/// (train on `wiki.train.raw` when present, else on `wiki.valid.raw`; evaluate on
/// `wiki.test.raw`... see [`resolve_dir`]), or explicit files.
#[derive(Clone, Debug)]
pub struct Splits {
    pub train: TextSplit,
    pub eval: TextSplit,
    /// Said in the log header, e.g. "trained on wiki.valid.raw (the train split is not shipped)".
    pub note: String,
    /// How the texts become blocks.
    pub corpus: Corpus,
}

/// How a training suite's texts become blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corpus {
    /// run_clm: each text's lines tokenized, grouped by 1000, cut into blocks ([`blocks`]).
    RunClm,
    /// llm.c's Tiny Shakespeare: one text, statements opened by <|endoftext|>, its tokens split
    /// into eval (first) and train ([`crate::scenarios::train::shakespeare`]).
    Dialogue,
}

impl Splits {
    pub fn sample() -> Self {
        Self {
            train: TextSplit {
                origin: "embedded:wikitext2_sample/wiki.valid.raw".into(),
                text: SAMPLE_TRAIN.into(),
            },
            eval: TextSplit {
                origin: "embedded:wikitext2_sample/wiki.test.raw".into(),
                text: SAMPLE_EVAL.into(),
            },
            note: "built-in sample: first lines of wiki.valid.raw (train) and wiki.test.raw (eval)"
                .into(),
            corpus: Corpus::RunClm,
        }
    }

    /// `--data DIR` or `--data TRAIN_FILE` (with `--eval-data EVAL_FILE`).
    pub fn from_path(path: &Path, eval: Option<&Path>) -> Result<Self> {
        if !path.exists() {
            return Err(Error::NotFound {
                what: "WikiText-2 data".into(),
                path: path.to_path_buf(),
                hint: "pass the directory holding wiki.train.raw / wiki.valid.raw / wiki.test.raw (wikitext-2-raw-v1)".into(),
            });
        }
        if path.is_dir() {
            return resolve_dir(path);
        }
        let eval = eval.map(Path::to_path_buf).ok_or_else(|| {
            Error::Config(format!(
                "--data {} is a file: give the evaluation file with --eval-data, or pass the directory holding wiki.*.raw",
                path.display()
            ))
        })?;
        Ok(Self {
            train: read_split(path)?,
            eval: read_split(&eval)?,
            note: format!(
                "trained on {}, evaluated on {}",
                path.display(),
                eval.display()
            ),
            corpus: Corpus::RunClm,
        })
    }
}

/// In a directory: train on `wiki.train.raw` if it is there, else on `wiki.valid.raw`;
/// evaluate on `wiki.test.raw` when training on `wiki.valid.raw`, else on `wiki.valid.raw`
/// (run_clm's validation split).
pub fn resolve_dir(dir: &Path) -> Result<Splits> {
    let f = |n: &str| -> PathBuf { dir.join(n) };
    if f("wiki.train.raw").is_file() {
        Ok(Splits {
            train: read_split(&f("wiki.train.raw"))?,
            eval: read_split(&f("wiki.valid.raw"))?,
            note: "trained on wiki.train.raw, evaluated on wiki.valid.raw (run_clm's splits)"
                .into(),
            corpus: Corpus::RunClm,
        })
    } else {
        Ok(Splits {
            train: read_split(&f("wiki.valid.raw"))?,
            eval: read_split(&f("wiki.test.raw"))?,
            note: "trained on wiki.valid.raw, evaluated on wiki.test.raw (no wiki.train.raw here)"
                .into(),
            corpus: Corpus::RunClm,
        })
    }
}

fn read_split(path: &Path) -> Result<TextSplit> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::NotFound {
                what: path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                path: path.to_path_buf(),
                hint: "WikiText-2 raw: wikitext-2-raw-v1.zip (wiki.train.raw, wiki.valid.raw, wiki.test.raw); pass --data DIR".into(),
            }
        } else {
            Error::io(format!("reading {}", path.display()), e)
        }
    })?;
    Ok(TextSplit {
        origin: path.display().to_string(),
        text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_split_like_python_keepends() {
        assert_eq!(
            split_lines_keepends(" a\n \n\r\nb\rc"),
            vec![" a\n", " \n", "\r\n", "b\r", "c"]
        );
        assert!(split_lines_keepends("").is_empty());
    }

    #[test]
    fn grouping_drops_each_chunks_remainder() {
        let lines: Vec<Vec<u32>> = (0..1001).map(|i| vec![i as u32; 3]).collect();
        // Chunk 1: 3000 tokens -> 1500 blocks of 2; chunk 2: 3 tokens -> 1 block, 1 dropped.
        let blocks = group_texts(&lines, 2);
        assert_eq!(blocks.len(), 1501);
        assert_eq!(blocks[1500], vec![1000, 1000]);
    }

    #[test]
    fn sample_groups_into_blocks() {
        let tok = TextTokenizer::gpt2().unwrap();
        let s = Splits::sample();
        let b = blocks(&s.train.text, &tok, 64).unwrap();
        assert!(
            b.len() > 50 && b.iter().all(|x| x.len() == 64),
            "{}",
            b.len()
        );
    }
}
