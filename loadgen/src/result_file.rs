//! Writing a result file (`--out`): into a regular file (or a new one) through a temporary
//! file renamed into place, so a reader never sees half a result; into anything else that
//! exists (a device such as `/dev/null`, a FIFO, `/dev/stdout`) directly, because a rename
//! would replace it with a regular file. As root, `--out /dev/null` once turned the machine's
//! `/dev/null` into a regular file that every later reader read stray output from.

use std::path::Path;

use anyhow::{Context, Result};

/// Writes `result` as pretty JSON to `path` (see the module docs).
pub fn write_result(path: &Path, result: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(result)?;
    if writes_in_place(path) {
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    } else {
        let tmp = path.with_extension("json.partial");
        std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, path).with_context(|| format!("renaming into {}", path.display()))?;
    }
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// Whether `path` exists as something other than a regular file (a device, a pipe, a
/// directory): written in place, never renamed over.
pub fn writes_in_place(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_written_in_place_files_are_renamed_into() {
        // Only metadata is read here: nothing writes to /dev/null.
        assert!(writes_in_place(Path::new("/dev/null")));
        let dir = std::env::temp_dir().join(format!("loadgen-result-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(writes_in_place(&dir));
        let file = dir.join("out.json");
        assert!(!writes_in_place(&file), "a new file is renamed into place");
        write_result(&file, &serde_json::json!({"good": 96})).unwrap();
        assert!(!writes_in_place(&file));
        let back: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert_eq!(back["good"], 96);
        assert!(!dir.join("out.json.partial").exists());
        // A directory is not replaced: writing into it fails and names it.
        let err = write_result(&dir, &1).unwrap_err().to_string();
        assert!(err.contains("loadgen-result"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
