//! Errors the library reports to users. Every message says what went wrong and what to do;
//! binaries print them once as `Error: {msg}` and exit non-zero.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown model '{name}': valid names are {valid} (or pass --model-dir DIR with config.json + model.safetensors)")]
    UnknownModel { name: String, valid: String },

    #[error("{path}:{line}: {msg}")]
    BadData {
        path: String,
        line: usize,
        msg: String,
    },

    #[error("{what} not found at {path}: {hint}")]
    NotFound {
        what: String,
        path: PathBuf,
        hint: String,
    },

    #[error("weights do not match the config: tensor '{tensor}' has shape {got:?} in the checkpoint, the config expects {expected:?}")]
    ShapeMismatch {
        tensor: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },

    #[error("tensor '{tensor}' is missing from the checkpoint in {dir} (does config.json match the weights?)")]
    MissingTensor { tensor: String, dir: PathBuf },

    #[error("{0}")]
    Config(String),

    #[error("{0}")]
    Unsupported(String),

    /// An engine (e.g. the HF worker) failed; the message holds its own words.
    #[error("{0}")]
    Engine(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// An error's message without the backtrace candle appends when `RUST_BACKTRACE` is set
/// (`\n   0: …` frames): what a log record keeps.
pub fn message_without_backtrace(message: &str) -> String {
    match message.find("\n   0: ") {
        Some(i) => message[..i].to_string(),
        None => message.to_string(),
    }
}

/// Bare I/O errors of the launcher and rendezvous (sockets, child processes); file errors
/// elsewhere carry their path through `Error::Io` directly.
impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Io {
            context: "launcher / rendezvous I/O".into(),
            source,
        }
    }
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn backtraces_are_cut_from_messages() {
        let m =
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n   0: <unknown>\n   1: main";
        assert_eq!(
            super::message_without_backtrace(m),
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        );
        assert_eq!(super::message_without_backtrace("a\nb"), "a\nb");
    }
}
