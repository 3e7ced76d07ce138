//! Fetched HTML turned into Markdown under limits, off the async workers.
//!
//! A fetched page is written by whoever controls the site, so its shape is hostile until proven
//! otherwise. Two shapes hurt a naive conversion: deep nesting (the Markdown walk recurses once
//! per element, so a few thousand nested `<div>`s overflow a worker thread's stack and abort the
//! process) and very deep nesting (the HTML tree builder scans its stack of open elements for
//! every tag, so 200,000 levels cost minutes of CPU before any walk starts). So:
//! - the page is parsed here, by html5ever into the same DOM the converter uses, fed in chunks;
//!   every node inserted is measured (its depth, counted up its parents, at most the limit plus
//!   one step), and the parse stops at the end of the chunk in which a node went past
//!   [`MAX_DEPTH`] or the deadline passed, so the tree builder never works on a deep stack;
//! - the finished tree is measured once more, exactly and without recursion, because the tree
//!   builder can move subtrees (adoption agency, foster parenting) after they were inserted;
//! - only a tree within the limit reaches the converter (`htmd`), on a thread of its own whose
//!   stack is sized for that depth with a wide margin, never on a runtime worker;
//! - conversions run at most one per core at a time, and the caller waits at most
//!   [`CONVERSION_TIMEOUT`] (plus a short grace for the walk, which cannot be interrupted but is
//!   bounded by the depth and body limits) and then gets an error; a thread it stopped waiting
//!   for keeps its slot until it ends, so abandoned work cannot pile up.
//!
//! A refused page is an error for the caller (`document_too_deep`, `document_timeout`), never a
//! crash or a stall; the raw text stays available with `to_markdown: false`.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::{Rc, Weak};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use html5ever::interface::{ElementFlags, NodeOrText, QualName, QuirksMode, TreeSink};
use html5ever::tendril::{StrTendril, TendrilSink};
use html5ever::{Attribute, ParseOpts};
use markup5ever_rcdom::{Handle, Node, NodeData, RcDom};
use tokio::sync::Semaphore;

/// Deepest element nesting converted. Real pages stay far below (a few dozen levels); the
/// converter's recursion at this depth needs a few megabytes of stack at most.
pub const MAX_DEPTH: usize = 512;
/// Longest a conversion may take, waiting for a free slot included.
pub const CONVERSION_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra wait for the Markdown walk, which is bounded but cannot be interrupted.
const WALK_GRACE: Duration = Duration::from_secs(5);
/// Input fed to the parser between two checks of depth and deadline.
const CHUNK_BYTES: usize = 16 * 1024;
/// Stack of a conversion thread. The walk of a page [`MAX_DEPTH`] levels deep fits in a
/// sixteenth of it in debug builds (a test keeps it so); the rest is margin, and it is address
/// space reserved: only the pages actually touched are backed by memory.
const STACK_BYTES: usize = 64 * 1024 * 1024;

/// Why a document was not converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// Elements nested deeper than the limit.
    #[error(
        "the HTML nests elements deeper than {limit} levels, more than any page needs; it was \
         not converted (fetch it with to_markdown: false for the raw text)"
    )]
    TooDeep {
        /// The limit.
        limit: usize,
    },
    /// The conversion did not finish in time.
    #[error(
        "converting the HTML took longer than {secs} s; it was stopped (fetch it with \
         to_markdown: false for the raw text)"
    )]
    Timeout {
        /// The limit, seconds.
        secs: u64,
    },
    /// The conversion thread could not be started or failed.
    #[error("the HTML could not be converted: {message}")]
    Failed {
        /// What happened.
        message: String,
    },
}

impl DocumentError {
    /// Stable code for tool results.
    pub fn code(&self) -> &'static str {
        match self {
            DocumentError::TooDeep { .. } => "document_too_deep",
            DocumentError::Timeout { .. } => "document_timeout",
            DocumentError::Failed { .. } => "conversion_failed",
        }
    }
}

/// One slot per core: a burst of conversions queues instead of taking every CPU.
fn slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
            Arc::new(Semaphore::new(cores))
        })
        .clone()
}

/// Converts `html` to Markdown within the limits of this module.
pub async fn html_to_markdown(html: String) -> Result<String, DocumentError> {
    let started = Instant::now();
    let timeout = DocumentError::Timeout {
        secs: CONVERSION_TIMEOUT.as_secs(),
    };
    let permit = tokio::time::timeout(CONVERSION_TIMEOUT, slots().acquire_owned())
        .await
        .map_err(|_| timeout.clone())?
        .map_err(|e| DocumentError::Failed {
            message: e.to_string(),
        })?;
    let deadline = started + CONVERSION_TIMEOUT;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("html-to-markdown".to_owned())
        .stack_size(STACK_BYTES)
        .spawn(move || {
            // The slot is held until the work ends, even when nobody waits for it any more.
            let _permit = permit;
            let outcome = std::panic::catch_unwind(|| convert(&html, MAX_DEPTH, deadline))
                .unwrap_or_else(|_| {
                    Err(DocumentError::Failed {
                        message: "the converter panicked".to_owned(),
                    })
                });
            let _ = tx.send(outcome);
        })
        .map_err(|e| DocumentError::Failed {
            message: format!("cannot start a conversion thread: {e}"),
        })?;
    let wait = (deadline + WALK_GRACE).saturating_duration_since(Instant::now());
    match tokio::time::timeout(wait, rx).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(_)) => Err(DocumentError::Failed {
            message: "the conversion thread ended without an answer".to_owned(),
        }),
        Err(_) => Err(timeout),
    }
}

/// Parses with the limits, then converts; runs on the conversion thread.
fn convert(html: &str, limit: usize, deadline: Instant) -> Result<String, DocumentError> {
    let document = parse(html, limit, deadline)?;
    if deepest(&document) > limit {
        return Err(DocumentError::TooDeep { limit });
    }
    if Instant::now() > deadline {
        return Err(DocumentError::Timeout {
            secs: CONVERSION_TIMEOUT.as_secs(),
        });
    }
    Ok(htmd::HtmlToMarkdown::new().tree_to_markdown(&document))
}

/// The DOM of `html`, parsed chunk by chunk with the depth and deadline checked in between.
fn parse(html: &str, limit: usize, deadline: Instant) -> Result<Handle, DocumentError> {
    // The options htmd itself parses with (scripting enabled: `<noscript>` is raw text).
    let mut parser = html5ever::parse_document(DepthSink::new(limit), ParseOpts::default());
    let mut rest = html;
    while !rest.is_empty() {
        let mut end = rest.len().min(CHUNK_BYTES);
        while !rest.is_char_boundary(end) {
            end += 1;
        }
        let (chunk, tail) = rest.split_at(end);
        parser.process(StrTendril::from_slice(chunk));
        rest = tail;
        if parser.tokenizer.sink.sink.too_deep.get() {
            return Err(DocumentError::TooDeep { limit });
        }
        if Instant::now() > deadline {
            return Err(DocumentError::Timeout {
                secs: CONVERSION_TIMEOUT.as_secs(),
            });
        }
    }
    let sink = parser.finish();
    if sink.too_deep.get() {
        return Err(DocumentError::TooDeep { limit });
    }
    Ok(sink.dom.document.clone())
}

/// The depth of the deepest node under `root` (template contents count as children of their
/// template), walked with an explicit stack.
fn deepest(root: &Handle) -> usize {
    let mut max = 0;
    let mut pending = vec![(root.clone(), 0usize)];
    while let Some((node, depth)) = pending.pop() {
        max = max.max(depth);
        for child in node.children.borrow().iter() {
            pending.push((child.clone(), depth + 1));
        }
        if let NodeData::Element {
            template_contents, ..
        } = &node.data
        {
            if let Some(contents) = template_contents.borrow().as_ref() {
                pending.push((contents.clone(), depth + 1));
            }
        }
    }
    max
}

/// The parent of `node`, read from rcdom's `Cell<Option<Weak>>` without disturbing it.
fn parent_of(node: &Node) -> Option<Handle> {
    let weak = node.parent.take();
    let parent = weak.as_ref().and_then(Weak::upgrade);
    node.parent.set(weak);
    parent
}

/// rcdom's tree sink, plus a depth check on every insertion. Parse errors are not kept: the
/// converter does not read them and a hostile page can make one per tag.
struct DepthSink {
    dom: RcDom,
    limit: usize,
    too_deep: Cell<bool>,
    /// Template contents (a separate fragment in rcdom) -> their template, so depth counts
    /// through them: nested templates are nested elements to the tree builder's stack.
    templates: RefCell<HashMap<*const Node, Weak<Node>>>,
}

impl DepthSink {
    fn new(limit: usize) -> Self {
        Self {
            dom: RcDom::default(),
            limit,
            too_deep: Cell::new(false),
            templates: RefCell::new(HashMap::new()),
        }
    }

    /// Depth of `node` below the document, counting at most `limit + 1` steps.
    fn depth(&self, node: &Handle) -> usize {
        let mut depth = 0;
        let mut current = node.clone();
        while depth <= self.limit {
            let next = parent_of(&current).or_else(|| {
                self.templates
                    .borrow()
                    .get(&Rc::as_ptr(&current))
                    .and_then(Weak::upgrade)
            });
            match next {
                Some(parent) => {
                    depth += 1;
                    current = parent;
                }
                None => break,
            }
        }
        depth
    }

    /// Flags the parse when a node inserted under `parent` is past the limit.
    fn inserted_under(&self, parent: &Handle) {
        if self.depth(parent) + 1 > self.limit {
            self.too_deep.set(true);
        }
    }
}

impl TreeSink for DepthSink {
    type Handle = Handle;
    type Output = Self;
    type ElemName<'a>
        = <RcDom as TreeSink>::ElemName<'a>
    where
        Self: 'a;

    fn finish(self) -> Self {
        self
    }

    fn parse_error(&self, _msg: std::borrow::Cow<'static, str>) {}

    fn get_document(&self) -> Handle {
        self.dom.get_document()
    }

    fn elem_name<'a>(&'a self, target: &'a Handle) -> Self::ElemName<'a> {
        self.dom.elem_name(target)
    }

    fn create_element(&self, name: QualName, attrs: Vec<Attribute>, flags: ElementFlags) -> Handle {
        let element = self.dom.create_element(name, attrs, flags);
        if let NodeData::Element {
            template_contents, ..
        } = &element.data
        {
            if let Some(contents) = template_contents.borrow().as_ref() {
                self.templates
                    .borrow_mut()
                    .insert(Rc::as_ptr(contents), Rc::downgrade(&element));
            }
        }
        element
    }

    fn create_comment(&self, text: StrTendril) -> Handle {
        self.dom.create_comment(text)
    }

    fn create_pi(&self, target: StrTendril, data: StrTendril) -> Handle {
        self.dom.create_pi(target, data)
    }

    fn append(&self, parent: &Handle, child: NodeOrText<Handle>) {
        self.inserted_under(parent);
        self.dom.append(parent, child);
    }

    fn append_based_on_parent_node(
        &self,
        element: &Handle,
        prev_element: &Handle,
        child: NodeOrText<Handle>,
    ) {
        self.inserted_under(element);
        self.inserted_under(prev_element);
        self.dom
            .append_based_on_parent_node(element, prev_element, child);
    }

    fn append_doctype_to_document(
        &self,
        name: StrTendril,
        public_id: StrTendril,
        system_id: StrTendril,
    ) {
        self.dom
            .append_doctype_to_document(name, public_id, system_id);
    }

    fn get_template_contents(&self, target: &Handle) -> Handle {
        self.dom.get_template_contents(target)
    }

    fn same_node(&self, x: &Handle, y: &Handle) -> bool {
        self.dom.same_node(x, y)
    }

    fn set_quirks_mode(&self, mode: QuirksMode) {
        self.dom.set_quirks_mode(mode);
    }

    fn append_before_sibling(&self, sibling: &Handle, new_node: NodeOrText<Handle>) {
        // The new node becomes a sibling: as deep as `sibling`, i.e. under its parent.
        if self.depth(sibling) > self.limit {
            self.too_deep.set(true);
        }
        self.dom.append_before_sibling(sibling, new_node);
    }

    fn add_attrs_if_missing(&self, target: &Handle, attrs: Vec<Attribute>) {
        self.dom.add_attrs_if_missing(target, attrs);
    }

    fn remove_from_parent(&self, target: &Handle) {
        self.dom.remove_from_parent(target);
    }

    fn reparent_children(&self, node: &Handle, new_parent: &Handle) {
        self.inserted_under(new_parent);
        self.dom.reparent_children(node, new_parent);
    }

    fn is_mathml_annotation_xml_integration_point(&self, handle: &Handle) -> bool {
        self.dom.is_mathml_annotation_xml_integration_point(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    fn nested(levels: usize) -> String {
        format!(
            "<html><body>{}deep{}</body></html>",
            "<div>".repeat(levels),
            "</div>".repeat(levels)
        )
    }

    #[test]
    fn ordinary_pages_convert_as_htmd_would() {
        for html in [
            "<h1>Title</h1><p>Hello <a href=\"/x\">link</a> and <b>bold</b></p><ul><li>a<li>b</ul>",
            "<table><tr><td>1<td>2</table><template><p>t</p></template><svg><path/></svg>",
            &nested(400),
        ] {
            let ours = convert(html, MAX_DEPTH, soon()).expect("converts");
            assert_eq!(ours, htmd::convert(html).expect("htmd"), "{html}");
        }
    }

    #[test]
    fn deep_nesting_is_refused_in_every_construction() {
        let limit = MAX_DEPTH;
        let too_deep = Err(DocumentError::TooDeep { limit });
        // Plain nesting, unclosed, and nesting by self-closing syntax (ignored on HTML elements).
        assert_eq!(convert(&nested(5_000), limit, soon()), too_deep);
        assert_eq!(convert(&"<div>".repeat(5_000), limit, soon()), too_deep);
        assert_eq!(convert(&"<span/>".repeat(5_000), limit, soon()), too_deep);
        // Nested templates (their contents live in separate fragments in the DOM).
        assert_eq!(
            convert(&"<template>".repeat(2_000), limit, soon()),
            too_deep
        );
        // Formatting elements reopened by the tree builder rather than written nested.
        let reopened: String = (0..3_000).map(|i| format!("<p><b id={i}>x</p>")).collect();
        assert_eq!(convert(&reopened, limit, soon()), too_deep);
        // Foster-parented content out of a table.
        let fostered = format!("<table>{}", "<div>".repeat(5_000));
        assert_eq!(convert(&fostered, limit, soon()), too_deep);
    }

    #[test]
    fn very_deep_nesting_is_refused_quickly() {
        let started = Instant::now();
        let html = nested(200_000);
        assert_eq!(
            convert(&html, MAX_DEPTH, soon()),
            Err(DocumentError::TooDeep { limit: MAX_DEPTH })
        );
        // The parse stops within the first chunks; the whole page would take minutes.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    /// The walk of the deepest accepted page fits in a sixteenth of the thread's stack.
    #[test]
    fn the_deepest_accepted_page_fits_the_stack_with_margin() {
        let html = format!(
            "{}deep <b>bold</b> <a href=\"/x\">link</a>{}",
            "<div><blockquote><ul><li>".repeat((MAX_DEPTH - 4) / 4),
            "</li></ul></blockquote></div>".repeat((MAX_DEPTH - 4) / 4)
        );
        let converted = std::thread::Builder::new()
            .stack_size(STACK_BYTES / 16)
            .spawn(move || convert(&html, MAX_DEPTH, soon()))
            .expect("thread")
            .join()
            .expect("no overflow");
        assert!(converted.is_ok_and(|m| m.contains("deep **bold**")));
    }

    #[test]
    fn a_past_deadline_stops_the_parse() {
        let html = "<p>x</p>".repeat(10_000);
        assert_eq!(
            convert(&html, MAX_DEPTH, Instant::now()),
            Err(DocumentError::Timeout {
                secs: CONVERSION_TIMEOUT.as_secs()
            })
        );
    }
}
