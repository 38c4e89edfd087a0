//! Opening the files a model is read from: regular files only.
//!
//! A FIFO, a character device or a directory in place of `config.json`,
//! `model.safetensors`, a shard, `tokenizer.json` or a GGUF file would block a
//! plain open (a FIFO waits for a writer) or read without end (`/dev/zero`).
//! Every file of the crate is opened here: without blocking, then checked to be
//! a regular file (a symbolic link to one is followed), else an
//! [`LlmError::BadFile`] naming the path and what it is.

use std::fs::File;
use std::path::Path;

use crate::error::LlmError;

/// Opens `path` for reading, refusing anything but a regular file.
pub(crate) fn open_regular(path: &Path) -> Result<File, LlmError> {
    let io = |source| LlmError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    // Opening a FIFO for reading blocks until a writer opens it, unless the
    // open does not block; the flag changes nothing for a regular file.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(io)?;
    let kind = file.metadata().map_err(io)?.file_type();
    if !kind.is_file() {
        return Err(LlmError::BadFile {
            path: path.to_path_buf(),
            reason: format!("not a regular file (a {})", describe(kind)),
        });
    }
    Ok(file)
}

/// The whole content of the regular file `path`.
pub(crate) fn read_regular(path: &Path) -> Result<Vec<u8>, LlmError> {
    use std::io::Read;
    let mut file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

/// The content of the regular file `path` as UTF-8 text.
pub(crate) fn read_regular_text(path: &Path) -> Result<String, LlmError> {
    String::from_utf8(read_regular(path)?).map_err(|e| LlmError::BadFile {
        path: path.to_path_buf(),
        reason: format!("not UTF-8 text: {e}"),
    })
}

fn describe(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "FIFO";
        }
        if kind.is_char_device() {
            return "character device";
        }
        if kind.is_block_device() {
            return "block device";
        }
        if kind.is_socket() {
            return "socket";
        }
    }
    if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }
}
