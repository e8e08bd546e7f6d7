//! The files a command is given: a ledger that must exist before it is read, and an
//! output file that must not destroy anything (a database, an input).

use crate::error::{Error, Result};

/// For commands that only read the ledger (`runs`, `report`): the path of a `sqlite://`
/// store whose file does not exist. That is a mistake (a typo in `--store`, the wrong
/// directory) or a ledger not made yet, never one to create: opening it would leave an
/// empty database behind.
pub(super) fn missing_ledger(url: &str) -> Result<Option<std::path::PathBuf>> {
    #[cfg(feature = "sqlite")]
    if crate::backend::Backend::of(url) == Some(crate::backend::Backend::Sqlite) {
        let options = crate::backend::sqlite::connect_options(url)?;
        let path = options.get_filename();
        if !path.as_os_str().is_empty()
            && path != std::path::Path::new(":memory:")
            && !path.exists()
        {
            return Ok(Some(path.to_path_buf()));
        }
    }
    Ok(None)
}

/// What [`missing_ledger`] found, in words.
pub(super) fn no_ledger_message(path: &std::path::Path) -> String {
    format!(
        "no ledger at {}: the file does not exist (check --store or IDEM_STORE; idem \
         creates the ledger on the first `idem run` or `idem migrate`)",
        path.display()
    )
}

/// Refuses an output file (`flag`) that cannot be written or would destroy something,
/// before anything runs (exit 2, nothing done): a folder, a file in a folder that does not
/// exist or cannot be written, any file of a SQLite database — the main file of an
/// existing one (a ledger or a warehouse) or its `-wal`, `-shm` or `-journal`, and every
/// file of the SQLite databases `databases` name (the store, a job's warehouse) even
/// before they exist — or one of `inputs` (the same file under any name).
pub(crate) fn refuse_to_overwrite(
    flag: &str,
    path: &std::path::Path,
    inputs: &[&std::path::Path],
    databases: &[&str],
) -> Result<()> {
    if path.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: that is a folder; name a file",
            path.display()
        )));
    }
    if path.file_name().is_none() {
        return Err(Error::input(format!(
            "{flag} {}: not a file name",
            path.display()
        )));
    }
    // Metrics are written to a temporary file renamed over the target: a device (say
    // /dev/full) would be replaced by a plain file, not written.
    if flag == "--metrics-file" && path.exists() && !path.is_file() {
        return Err(Error::input(format!(
            "{flag} {}: not a regular file (the metrics replace it whole, by a rename)",
            path.display()
        )));
    }
    if let Some(database) = database_of(path, databases) {
        let what = if same_file(path, &database) {
            "that file is a SQLite database".to_string()
        } else {
            format!(
                "that file belongs to the SQLite database {}",
                database.display()
            )
        };
        return Err(Error::input(format!(
            "{flag} {}: {what} (a ledger or a warehouse); writing there would destroy it. \
             Write to another file",
            path.display(),
        )));
    }
    if let Some(input) = inputs.iter().find(|input| same_file(path, input)) {
        return Err(Error::input(format!(
            "{flag} {}: that is the same file as {}, which this command also reads or \
             writes; writing there would destroy it. Write to another file",
            path.display(),
            input.display()
        )));
    }
    let folder = match path.parent() {
        Some(f) if !f.as_os_str().is_empty() => f,
        _ => std::path::Path::new("."),
    };
    if !folder.is_dir() {
        return Err(Error::input(format!(
            "{flag} {}: the folder {} does not exist",
            path.display(),
            folder.display()
        )));
    }
    writable(path, folder).map_err(|e| {
        Error::input(format!(
            "{flag} {}: cannot be written ({e}); nothing was run",
            path.display()
        ))
    })
}

/// Whether `path` can be written: an existing file opened for writing (not truncated),
/// else a file created in its folder and removed again.
pub(super) fn writable(path: &std::path::Path, folder: &std::path::Path) -> std::io::Result<()> {
    if path.exists() {
        return std::fs::OpenOptions::new().write(true).open(path).map(drop);
    }
    let probe = folder.join(format!(".idem-probe.{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// The SQLite database `path` is a file of, if any: an existing database itself, the
/// `-wal`, `-shm` or `-journal` of an existing one, or any of these files of the SQLite
/// databases `urls` name (existing or not).
pub(super) fn database_of(path: &std::path::Path, urls: &[&str]) -> Option<std::path::PathBuf> {
    const COMPANIONS: [&str; 4] = ["", "-wal", "-shm", "-journal"];
    #[cfg(feature = "sqlite")]
    {
        use crate::backend::sqlite::is_sqlite_database;
        if is_sqlite_database(path) {
            return Some(path.to_path_buf());
        }
        let name = path.file_name()?.to_string_lossy().into_owned();
        for suffix in &COMPANIONS[1..] {
            if let Some(stem) = name.strip_suffix(suffix) {
                let main = path.with_file_name(stem);
                if !stem.is_empty() && is_sqlite_database(&main) {
                    return Some(main);
                }
            }
        }
        for url in urls
            .iter()
            .filter(|u| crate::backend::Backend::of(u) == Some(crate::backend::Backend::Sqlite))
        {
            let Ok(options) = crate::backend::sqlite::connect_options(url) else {
                continue;
            };
            let main = options.get_filename().to_path_buf();
            for suffix in COMPANIONS {
                let mut file = main.clone().into_os_string();
                file.push(suffix);
                if same_file(path, std::path::Path::new(&file)) {
                    return Some(main);
                }
            }
        }
    }
    #[cfg(not(feature = "sqlite"))]
    let _ = (path, urls, COMPANIONS);
    None
}

/// Whether two paths name one file: the same device and inode when both exist, else the
/// same absolute path.
pub(super) fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        if let (Ok(x), Ok(y)) = (std::fs::metadata(a), std::fs::metadata(b)) {
            return x.dev() == y.dev() && x.ino() == y.ino();
        }
    }
    let absolute = |p: &std::path::Path| {
        std::path::absolute(p)
            .ok()
            .map(|p| p.components().collect::<std::path::PathBuf>())
    };
    absolute(a).is_some_and(|x| Some(x) == absolute(b))
}
