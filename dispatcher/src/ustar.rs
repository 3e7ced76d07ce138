//! The ustar header rules both tar writers follow (`archive.rs` for workspaces, `install.rs` for
//! the executor volume) and the checksum the reader checks, written once.

/// One entry's header fields, as both writers fill them.
pub(crate) struct Entry<'a> {
    /// Its name, cut to the 100 bytes of the field (a pax record before it says the rest).
    pub name: &'a [u8],
    /// Its type flag (`b'0'` a file, `b'5'` a directory, ...).
    pub kind: u8,
    /// Its permission bits.
    pub mode: u32,
    /// Its owner and group.
    pub owner: (u32, u32),
    /// Its size, bytes (at most the field's 11 octal digits).
    pub size: u64,
    /// Its modification time, Unix seconds.
    pub mtime: u64,
    /// A link's target, cut like the name.
    pub link: &'a [u8],
}

impl Entry<'_> {
    /// Appends the entry's header block to `out`.
    pub(crate) fn append_header(&self, out: &mut Vec<u8>) {
        let mut header = [0u8; 512];
        let n = self.name.len().min(100);
        header[..n].copy_from_slice(&self.name[..n]);
        octal(&mut header[100..108], u64::from(self.mode));
        octal(&mut header[108..116], u64::from(self.owner.0));
        octal(&mut header[116..124], u64::from(self.owner.1));
        octal(&mut header[124..136], self.size);
        octal(&mut header[136..148], self.mtime);
        header[156] = self.kind;
        let l = self.link.len().min(100);
        header[157..157 + l].copy_from_slice(&self.link[..l]);
        seal(&mut header);
        out.extend_from_slice(&header);
    }
}

/// Writes `value` as zero-padded octal digits in all of `field` but its last byte (left NUL),
/// at most the largest number those digits hold.
fn octal(field: &mut [u8], value: u64) {
    let digits = field.len() - 1;
    let text = format!("{:0digits$o}", value.min(8u64.pow(digits as u32) - 1));
    field[..digits].copy_from_slice(text.as_bytes());
}

/// A header's checksum: every byte summed, the checksum field (bytes 148..156) counted as
/// spaces; `byte` reads the others (unsigned as POSIX says, or signed as some old tars did).
pub(crate) fn checksum(header: &[u8], byte: impl Fn(u8) -> i64) -> i64 {
    header
        .iter()
        .enumerate()
        .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { byte(b) })
        .sum()
}

/// Finishes a header whose fields are written: the ustar magic and version, then the checksum
/// (six octal digits, a NUL and a space).
fn seal(header: &mut [u8]) {
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    let sum = checksum(header, i64::from);
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}
