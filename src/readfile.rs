//! Files named on the command line are read up to a limit, so that `/dev/zero` or a
//! huge file is refused at once instead of filling memory.

use std::io::Read;
use std::path::Path;

/// Bound on an ACL token file (tokens are UUIDs; this leaves room for anything sane).
pub const TOKEN_LIMIT: u64 = 64 * 1024;
/// Bound on a CA, client certificate or key file (PEM bundles stay far below).
pub const PEM_LIMIT: u64 = 1024 * 1024;

/// Reads at most `limit` bytes of `path`; a longer file is an error naming `what_limit`.
pub fn read_bounded(path: &Path, limit: u64, what_limit: &str) -> Result<Vec<u8>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!(
            "the file is larger than {limit} bytes ({what_limit}); refusing to read it"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_at_the_limit() {
        let err = read_bounded(Path::new("/dev/zero"), 1000, "a test limit").unwrap_err();
        assert!(err.contains("larger than 1000 bytes"), "{err}");
        let dir = std::env::temp_dir().join(format!("conlock-readfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("exact");
        std::fs::write(&f, vec![b'x'; 1000]).unwrap();
        assert_eq!(read_bounded(&f, 1000, "x").unwrap().len(), 1000);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
