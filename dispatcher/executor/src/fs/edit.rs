//! `fs.edit` and `fs.multi_edit`: exact-string replacement, all or nothing.
//!
//! The file is read whole (it must be UTF-8 text within `max_file_bytes`), every edit is applied
//! in memory in order, and only if all succeed is the result written back through the same
//! replace-by-rename as `fs.write`. Each `old_string` must occur exactly once in the text as it
//! stands after the previous edits; otherwise the error names the edit's index and the count.

use rustix::fd::AsFd;
use rustix::fs::{Mode, OFlags};

use crate::context::Context;
use crate::error::{OpError, OpResult};
use crate::fs::{list, read_capped, require_regular, write, READ_FLAGS};
use crate::protocol::{Edit, EditParams, EditResult, ErrorKind, MultiEditParams};
use crate::roots::Access;

/// Runs `fs.edit`.
pub fn run_single(ctx: &Context, params: EditParams) -> OpResult<EditResult> {
    let edit = Edit {
        old_string: params.old_string,
        new_string: params.new_string,
    };
    edit_file(ctx, &params.path, std::slice::from_ref(&edit), false)
}

/// Runs `fs.multi_edit`.
pub fn run_multi(ctx: &Context, params: MultiEditParams) -> OpResult<EditResult> {
    if params.edits.is_empty() {
        return Err(OpError::invalid("edits is empty"));
    }
    edit_file(ctx, &params.path, &params.edits, true)
}

fn edit_file(ctx: &Context, path: &str, edits: &[Edit], numbered: bool) -> OpResult<EditResult> {
    let target = ctx.roots.resolve(path, Access::ReadWrite)?;
    let (parent, name) = target.parent()?;
    let display = &target.display;
    let Some(before) = write::check_replaceable(parent.as_fd(), name, display)? else {
        return Err(OpError::new(
            ErrorKind::NotFound,
            format!("'{display}' does not exist"),
        ));
    };
    let fd = rustix::fs::openat(&parent, name, READ_FLAGS | OFlags::NOFOLLOW, Mode::empty())
        .map_err(|e| OpError::os(e, "cannot open", display))?;
    require_regular(&fd, display)?;
    let (bytes, more) = read_capped(fd, ctx.config.max_file_bytes, display)?;
    if more {
        return Err(OpError::new(
            ErrorKind::TooLarge,
            format!(
                "'{display}' is larger than the limit of {} bytes",
                ctx.config.max_file_bytes
            ),
        ));
    }
    let text = String::from_utf8(bytes)
        .map_err(|_| OpError::invalid(format!("'{display}' is not UTF-8 text")))?;
    let edited = apply(&text, edits, display, numbered)?;
    if edited.len() as u64 > ctx.config.max_file_bytes {
        return Err(OpError::new(
            ErrorKind::TooLarge,
            format!(
                "edited '{display}' would be {} bytes, more than the limit of {}",
                edited.len(),
                ctx.config.max_file_bytes
            ),
        ));
    }
    // The file's user metadata stays with it.
    let metadata = list::metadata_of(parent.as_fd(), name);
    write::replace(
        parent.as_fd(),
        name,
        edited.as_bytes(),
        before.st_mode & 0o777,
        &metadata,
        display,
    )?;
    Ok(EditResult {
        replacements: edits.len() as u64,
    })
}

/// Applies `edits` in order to `text`; `numbered` puts the edit index in messages.
pub fn apply(text: &str, edits: &[Edit], display: &str, numbered: bool) -> OpResult<String> {
    let mut current = text.to_string();
    for (index, edit) in edits.iter().enumerate() {
        let which = if numbered {
            format!("edit {index}: ")
        } else {
            String::new()
        };
        if edit.old_string.is_empty() {
            return Err(OpError::invalid(format!("{which}old_string is empty")));
        }
        let Some(at) = current.find(&edit.old_string) else {
            return Err(OpError::new(
                ErrorKind::EditTargetNotFound,
                format!("{which}old_string does not occur in '{display}'; nothing was changed"),
            ));
        };
        let next_char = current[at..].chars().next().map_or(1, char::len_utf8);
        if current[at + next_char..].contains(&edit.old_string) {
            let count = current.matches(&edit.old_string).count().max(2);
            return Err(OpError::new(
                ErrorKind::EditTargetAmbiguous,
                format!(
                    "{which}old_string occurs {count} times in '{display}' (it must occur exactly once; add surrounding context); nothing was changed"
                ),
            ));
        }
        current.replace_range(at..at + edit.old_string.len(), &edit.new_string);
    }
    Ok(current)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(old: &str, new: &str) -> Edit {
        Edit {
            old_string: old.into(),
            new_string: new.into(),
        }
    }

    #[test]
    fn edits_apply_in_sequence() {
        let out = apply(
            "fn a() {}\n",
            &[edit("a()", "b()"), edit("b() {}", "b() { 1 }")],
            "f",
            true,
        );
        assert_eq!(out.unwrap(), "fn b() { 1 }\n");
    }

    #[test]
    fn missing_and_repeated_targets_fail_with_the_index() {
        let err = apply("x y x", &[edit("y", "z"), edit("x", "w")], "f", true).unwrap_err();
        assert_eq!(err.kind, ErrorKind::EditTargetAmbiguous);
        assert!(err.message.starts_with("edit 1:"), "{}", err.message);
        assert!(err.message.contains("2 times"), "{}", err.message);
        let err = apply("abc", &[edit("q", "z")], "f", false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::EditTargetNotFound);
        assert_eq!(
            apply("abc", &[edit("", "z")], "f", false).unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }

    #[test]
    fn overlapping_occurrences_are_ambiguous() {
        let err = apply("aaa", &[edit("aa", "b")], "f", false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::EditTargetAmbiguous);
        assert_eq!(apply("éaé", &[edit("a", "b")], "f", false).unwrap(), "ébé");
    }
}
