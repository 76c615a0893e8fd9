//! Output-path safety: never write over the input, and write through a temporary file that is
//! renamed into place only on success (see [`damascus_gguf::GgufWriter::write_to_path`]).

use std::path::Path;

use crate::ConvertError;

/// Fails if `output` names the same file as `input`: equal paths, equal canonical paths
/// (symlinks, `..`), or — on Unix — the same inode (hard links).
pub fn ensure_distinct(input: &Path, output: &Path) -> Result<(), ConvertError> {
    let same = || ConvertError::SameFile {
        input: input.to_path_buf(),
        output: output.to_path_buf(),
    };
    if input == output {
        return Err(same());
    }
    let Ok(out_meta) = std::fs::metadata(output) else {
        // The output does not exist yet (or is unreadable; writing will report that).
        return Ok(());
    };
    if let (Ok(a), Ok(b)) = (input.canonicalize(), output.canonicalize())
        && a == b
    {
        return Err(same());
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let Ok(in_meta) = std::fs::metadata(input)
            && in_meta.dev() == out_meta.dev()
            && in_meta.ino() == out_meta.ino()
        {
            return Err(same());
        }
    }
    #[cfg(not(unix))]
    let _ = out_meta;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_same_file_in_all_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a.gguf");
        std::fs::write(&a, b"x").unwrap();
        assert!(ensure_distinct(&a, &a).is_err());
        let dotted = dir.path().join(".").join("a.gguf");
        assert!(ensure_distinct(&a, &dotted).is_err());
        let hard = dir.path().join("hard.gguf");
        std::fs::hard_link(&a, &hard).unwrap();
        assert!(ensure_distinct(&a, &hard).is_err());
        #[cfg(unix)]
        {
            let sym = dir.path().join("sym.gguf");
            std::os::unix::fs::symlink(&a, &sym).unwrap();
            assert!(ensure_distinct(&a, &sym).is_err());
        }
        let other = dir.path().join("b.gguf");
        assert!(ensure_distinct(&a, &other).is_ok());
        std::fs::write(&other, b"y").unwrap();
        assert!(ensure_distinct(&a, &other).is_ok());
    }
}
