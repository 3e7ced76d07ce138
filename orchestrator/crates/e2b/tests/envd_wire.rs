//! envd's messages over the Connect protocol, as E2B's Python SDK writes and reads them: JSON
//! and binary round trips, the exact bytes of what the SDK sends (written by hand from the
//! protos and the Connect protocol, not captured), and the refusals of malformed input.

use aegis_e2b::connect::{
    decode_unary, encode_unary, end_stream_frame, envelope, message_frame, Code, Codec,
    ConnectError, EndStream, EnvelopeDecoder, EnvelopeError, Message, RequestStreamDecoder,
    ResponseStreamDecoder, StreamItem, FLAG_COMPRESSED, FLAG_END_STREAM,
};
use aegis_e2b::envd::filesystem::{
    self, watch_dir_response, EntryInfo, EventType, FileType, FilesystemEvent, ListDirRequest,
    WatchDirRequest, WatchDirResponse,
};
use aegis_e2b::envd::process::{
    self, process_event, process_input, process_selector, stream_input_request, ProcessConfig,
    ProcessEvent, ProcessInput, ProcessSelector, Pty, SendInputRequest, SendSignalRequest, Signal,
    StartRequest, StartResponse, StreamInputRequest, UpdateRequest,
};

const MAX: usize = 1 << 20;

fn json<M: Message>(text: &str) -> M {
    decode_unary(Codec::Json, text.as_bytes(), MAX).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn as_json<M: Message>(m: &M) -> serde_json::Value {
    serde_json::from_slice(&encode_unary(Codec::Json, m).unwrap()).unwrap()
}

fn round_trips<M: Message + PartialEq + std::fmt::Debug>(m: &M) {
    for codec in [Codec::Json, Codec::Proto] {
        let bytes = encode_unary(codec, m).unwrap();
        let back: M = decode_unary(codec, &bytes, MAX).unwrap();
        assert_eq!(&back, m, "{codec:?}");
    }
}

fn selector(pid: u32) -> Option<ProcessSelector> {
    Some(ProcessSelector {
        selector: Some(process_selector::Selector::Pid(pid)),
    })
}

fn event(e: process_event::Event) -> StartResponse {
    StartResponse {
        event: Some(ProcessEvent { event: Some(e) }),
    }
}

fn start_request() -> StartRequest {
    StartRequest {
        process: Some(ProcessConfig {
            cmd: "/bin/bash".into(),
            args: vec!["-l".into(), "-c".into(), "echo hi".into()],
            envs: [("FOO".to_string(), "bar".to_string())].into(),
            cwd: Some("/home/user".into()),
        }),
        pty: None,
        tag: None,
        stdin: Some(false),
    }
}

#[test]
fn decodes_the_start_request_the_sdk_sends() {
    // commands.run("echo hi", envs={"FOO": "bar"}, cwd="/home/user"): bash -l -c, stdin off.
    let sent = r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"FOO":"bar"},"cwd":"/home/user"},"stdin":false}"#;
    assert_eq!(json::<StartRequest>(sent), start_request());
    // An explicit false survives the trip (proto3 `optional`): the SDK's "no stdin".
    assert_eq!(as_json(&start_request())["stdin"], serde_json::json!(false));

    // Binary: StartRequest{process: ProcessConfig{cmd: "ls"}, stdin: false}.
    let bytes = [0x0a, 0x04, 0x0a, 0x02, b'l', b's', 0x20, 0x00];
    let m: StartRequest = decode_unary(Codec::Proto, &bytes, MAX).unwrap();
    assert_eq!(m.process.unwrap().cmd, "ls");
    assert_eq!(m.stdin, Some(false));

    // A PTY start (sandbox.pty.create) with a tag.
    let pty: StartRequest = json(
        r#"{"process":{"cmd":"/bin/bash","args":["-i","-l"],"envs":{"TERM":"xterm-256color"}},"pty":{"size":{"cols":80,"rows":24}},"tag":"t1"}"#,
    );
    assert_eq!(pty.pty.unwrap().size.unwrap().cols, 80);
    assert_eq!(pty.tag.as_deref(), Some("t1"));
    assert_eq!(pty.stdin, None, "absent means the envd default");
}

#[test]
fn the_event_stream_the_sdk_reads() {
    let events = [
        (
            event(process_event::Event::Start(process_event::StartEvent {
                pid: 42,
            })),
            r#"{"event":{"start":{"pid":42}}}"#,
        ),
        (
            event(process_event::Event::Data(process_event::DataEvent {
                output: Some(process_event::data_event::Output::Stdout(
                    b"hello\n".to_vec(),
                )),
            })),
            r#"{"event":{"data":{"stdout":"aGVsbG8K"}}}"#,
        ),
        (
            event(process_event::Event::Data(process_event::DataEvent {
                output: Some(process_event::data_event::Output::Pty(vec![0x1b, b'['])),
            })),
            r#"{"event":{"data":{"pty":"G1s="}}}"#,
        ),
        (
            event(process_event::Event::Keepalive(process_event::KeepAlive {})),
            r#"{"event":{"keepalive":{}}}"#,
        ),
        (
            // Exit code 0 is the default, so JSON leaves it out; the SDK reads it as 0.
            event(process_event::Event::End(process_event::EndEvent {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            })),
            r#"{"event":{"end":{"exited":true,"status":"exit status 0"}}}"#,
        ),
        (
            event(process_event::Event::End(process_event::EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: Some("signal: killed".into()),
            })),
            r#"{"event":{"end":{"exitCode":-1,"status":"signal: killed","error":"signal: killed"}}}"#,
        ),
    ];
    let mut body = Vec::new();
    for (m, text) in &events {
        assert_eq!(
            as_json(m),
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        assert_eq!(&json::<StartResponse>(text), m);
        round_trips(m);
        body.extend(message_frame(Codec::Json, m).unwrap());
    }
    body.extend(end_stream_frame(&EndStream::ok()));

    // The first frame on the wire, byte for byte: flags 0, length 30, then the JSON.
    let first = br#"{"event":{"start":{"pid":42}}}"#;
    assert_eq!(body[..5], [0, 0, 0, 0, first.len() as u8]);
    assert_eq!(&body[5..5 + first.len()], first);
    // The last frame: flags 0x02, `{}`.
    assert_eq!(
        body[body.len() - 7..],
        [FLAG_END_STREAM, 0, 0, 0, 2, b'{', b'}']
    );

    // Read back one byte at a time, as a slow network delivers it.
    let mut reader = ResponseStreamDecoder::<StartResponse>::new(Codec::Json, MAX);
    let mut items = Vec::new();
    for b in &body {
        items.extend(reader.feed(std::slice::from_ref(b)).unwrap());
    }
    reader.finish().unwrap();
    assert_eq!(items.len(), events.len() + 1);
    for (item, (m, _)) in items.iter().zip(&events) {
        assert_eq!(item, &StreamItem::Message(m.clone()));
    }
    assert_eq!(items.last(), Some(&StreamItem::End(EndStream::ok())));

    // Binary: StartResponse{event: ProcessEvent{start: StartEvent{pid: 42}}}.
    let start = [0x0a, 0x04, 0x0a, 0x02, 0x08, 0x2a];
    assert_eq!(encode_unary(Codec::Proto, &events[0].0).unwrap(), start);
    // EndEvent{exit_code: 1 (sint32: zigzag 2), exited: true, status: "exit status 1"}.
    let mut end = vec![0x0a, 0x15, 0x1a, 0x13, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x0d];
    end.extend_from_slice(b"exit status 1");
    let m: StartResponse = decode_unary(Codec::Proto, &end, MAX).unwrap();
    let Some(process_event::Event::End(e)) = m.event.unwrap().event else {
        panic!("not an end event");
    };
    assert_eq!(
        (e.exit_code, e.exited, e.status.as_str()),
        (1, true, "exit status 1")
    );
}

#[test]
fn a_failed_stream_ends_with_the_error_the_sdk_maps() {
    let err = ConnectError::new(Code::NotFound, "process with pid 9 not found");
    let frame = end_stream_frame(&EndStream::failed(err.clone()));
    let payload = br#"{"error":{"code":"not_found","message":"process with pid 9 not found"}}"#;
    assert_eq!(frame[0], FLAG_END_STREAM);
    assert_eq!(
        u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize,
        payload.len()
    );
    assert_eq!(&frame[5..], payload);

    let mut reader = ResponseStreamDecoder::<StartResponse>::new(Codec::Json, MAX);
    let items = reader.feed(&frame).unwrap();
    assert_eq!(items, vec![StreamItem::End(EndStream::failed(err))]);
    // Nothing may follow the end.
    let more = message_frame(Codec::Json, &StartResponse::default()).unwrap();
    let refused = reader.feed(&more).unwrap_err();
    assert!(
        refused.message.contains("after the end-stream"),
        "{refused}"
    );

    // Trailers travel in `metadata`.
    let mut end = EndStream::ok();
    end.metadata
        .insert("x-trace".into(), vec!["a".into(), "b".into()]);
    assert_eq!(EndStream::from_json(&end.to_json()).unwrap(), end);
    assert_eq!(end.to_json(), br#"{"metadata":{"x-trace":["a","b"]}}"#);
}

#[test]
fn the_unary_calls_the_sdk_makes() {
    // commands.send_stdin(pid, "hi")
    let input: SendInputRequest = json(r#"{"process":{"pid":42},"input":{"stdin":"aGk="}}"#);
    assert_eq!(
        input,
        SendInputRequest {
            process: selector(42),
            input: Some(ProcessInput {
                input: Some(process_input::Input::Stdin(b"hi".to_vec())),
            }),
        }
    );
    round_trips(&input);

    // commands.kill(pid): the enum by name, and by number as proto3 JSON also allows.
    let kill: SendSignalRequest = json(r#"{"process":{"pid":42},"signal":"SIGNAL_SIGKILL"}"#);
    assert_eq!(kill.signal(), Signal::Sigkill);
    assert_eq!(as_json(&kill)["signal"], "SIGNAL_SIGKILL");
    let by_number: SendSignalRequest = json(r#"{"process":{"pid":42},"signal":9}"#);
    assert_eq!(by_number, kill);
    round_trips(&kill);

    // connect by tag; pty.resize.
    let by_tag: process::ConnectRequest = json(r#"{"process":{"tag":"t1"}}"#);
    assert_eq!(
        by_tag.process.unwrap().selector,
        Some(process_selector::Selector::Tag("t1".into()))
    );
    let resize: UpdateRequest =
        json(r#"{"process":{"pid":7},"pty":{"size":{"cols":120,"rows":40}}}"#);
    assert_eq!(
        resize.pty,
        Some(Pty {
            size: Some(process::pty::Size {
                cols: 120,
                rows: 40
            })
        })
    );
    round_trips(&resize);

    // An empty message is `{}` (commands.list).
    let list: process::ListRequest = json("{}");
    assert_eq!(encode_unary(Codec::Json, &list).unwrap(), b"{}");
    assert_eq!(encode_unary(Codec::Proto, &list).unwrap(), b"");
    let _: process::ListRequest = decode_unary(Codec::Proto, b"", MAX).unwrap();

    // files.list(path, depth=1); files.watch_dir(path, recursive=True) with entries.
    let list_dir: ListDirRequest = json(r#"{"path":"/home/user","depth":1}"#);
    assert_eq!((list_dir.path.as_str(), list_dir.depth), ("/home/user", 1));
    let watch: WatchDirRequest = json(r#"{"path":"/tmp","recursive":true,"includeEntry":true}"#);
    assert!(watch.recursive && watch.include_entry && !watch.allow_network_mounts);
    // proto3 JSON readers also take the proto field name.
    let snake: WatchDirRequest = json(r#"{"path":"/tmp","recursive":true,"include_entry":true}"#);
    assert_eq!(snake, watch);
}

#[test]
fn entries_and_watch_events_as_the_sdk_reads_them() {
    let entry = EntryInfo {
        name: "a.txt".into(),
        r#type: FileType::File as i32,
        path: "/home/user/a.txt".into(),
        size: 12,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        modified_time: Some(aegis_e2b::envd::Timestamp {
            seconds: 1_704_164_645,
            nanos: 0,
        }),
        symlink_target: None,
        metadata: [("k".to_string(), "v".to_string())].into(),
    };
    // int64 as a string, the enum by name, the timestamp in RFC 3339.
    let expected = serde_json::json!({
        "name": "a.txt", "type": "FILE_TYPE_FILE", "path": "/home/user/a.txt", "size": "12",
        "mode": 420, "permissions": "-rw-r--r--", "owner": "user", "group": "user",
        "modifiedTime": "2024-01-02T03:04:05Z", "metadata": {"k": "v"}
    });
    assert_eq!(as_json(&entry), expected);
    // A reader also takes the size as a number.
    let mut as_number = expected.clone();
    as_number["size"] = serde_json::json!(12);
    assert_eq!(json::<EntryInfo>(&as_number.to_string()), entry);
    round_trips(&entry);

    let created = WatchDirResponse {
        event: Some(watch_dir_response::Event::Filesystem(FilesystemEvent {
            name: "a.txt".into(),
            r#type: EventType::Create as i32,
            entry: Some(entry),
        })),
    };
    let text = as_json(&created);
    assert_eq!(text["filesystem"]["type"], "EVENT_TYPE_CREATE");
    assert_eq!(text["filesystem"]["entry"]["size"], "12");
    round_trips(&created);
    let started = WatchDirResponse {
        event: Some(watch_dir_response::Event::Start(
            watch_dir_response::StartEvent {},
        )),
    };
    assert_eq!(as_json(&started), serde_json::json!({"start": {}}));
    let polled: filesystem::GetWatcherEventsResponse =
        json(r#"{"events":[{"name":"b","type":"EVENT_TYPE_REMOVE"}]}"#);
    assert_eq!(polled.events[0].r#type(), EventType::Remove);
}

#[test]
fn reads_a_client_stream_in_any_chunking() {
    let messages = [
        StreamInputRequest {
            event: Some(stream_input_request::Event::Start(
                stream_input_request::StartEvent {
                    process: selector(7),
                },
            )),
        },
        StreamInputRequest {
            event: Some(stream_input_request::Event::Data(
                stream_input_request::DataEvent {
                    input: Some(ProcessInput {
                        input: Some(process_input::Input::Stdin(b"hi\n".to_vec())),
                    }),
                },
            )),
        },
        StreamInputRequest {
            event: Some(stream_input_request::Event::Keepalive(
                stream_input_request::KeepAlive {},
            )),
        },
    ];
    for codec in [Codec::Json, Codec::Proto] {
        let body: Vec<u8> = messages
            .iter()
            .flat_map(|m| message_frame(codec, m).unwrap())
            .collect();
        for chunk in [1, 2, 5, 6, 7, body.len()] {
            let mut reader = RequestStreamDecoder::<StreamInputRequest>::new(codec, 64);
            let mut got = Vec::new();
            for piece in body.chunks(chunk) {
                got.extend(reader.feed(piece).unwrap());
            }
            reader.finish().unwrap();
            assert_eq!(got, messages, "{codec:?}, chunks of {chunk}");
        }
    }
    // The JSON the SDK's codec would write for the same stream.
    let body: Vec<u8> = [
        &br#"{"start":{"process":{"pid":7}}}"#[..],
        br#"{"data":{"input":{"stdin":"aGkK"}}}"#,
        br#"{"keepalive":{}}"#,
    ]
    .iter()
    .flat_map(|p| envelope(0, p))
    .collect();
    let mut reader = RequestStreamDecoder::<StreamInputRequest>::new(Codec::Json, 64);
    assert_eq!(reader.feed(&body).unwrap(), messages);
}

#[test]
fn refuses_malformed_envelopes() {
    // A declared length over the limit is refused from the prefix alone.
    let mut decoder = EnvelopeDecoder::new(16);
    let err = decoder.feed(&[0, 0, 0, 0, 17]).unwrap_err();
    assert_eq!(
        err,
        EnvelopeError::TooLarge {
            index: 0,
            declared: 17,
            max: 16
        }
    );
    assert_eq!(err.to_connect_error().code, Code::ResourceExhausted);
    let mut decoder = EnvelopeDecoder::new(MAX);
    assert!(matches!(
        decoder.feed(&[0, 0xff, 0xff, 0xff, 0xff]),
        Err(EnvelopeError::TooLarge {
            declared: 4_294_967_295,
            ..
        })
    ));

    // A body that stops inside a prefix or a payload.
    let mut decoder = EnvelopeDecoder::new(MAX);
    assert!(decoder.feed(&[0, 0, 0]).unwrap().is_empty());
    assert_eq!(
        decoder.finish().unwrap_err().to_string(),
        "stream ended inside envelope 0: 3 of 5 bytes"
    );
    let mut decoder = EnvelopeDecoder::new(MAX);
    let mut body = envelope(0, b"{}");
    body.extend([0, 0, 0, 0, 10, b'{']);
    assert_eq!(decoder.feed(&body).unwrap().len(), 1);
    assert_eq!(
        decoder.finish().unwrap_err(),
        EnvelopeError::Truncated {
            index: 1,
            received: 6,
            expected: 15
        }
    );

    // Unknown flag bits.
    let mut decoder = EnvelopeDecoder::new(MAX);
    let err = decoder.feed(&envelope(0x04, b"{}")).unwrap_err();
    assert!(err.to_string().contains("unknown flags 0x04"), "{err}");

    // A client stream: no compression was negotiated, and it never sends an end-stream frame.
    let mut reader = RequestStreamDecoder::<StreamInputRequest>::new(Codec::Json, MAX);
    let err = reader.feed(&envelope(FLAG_COMPRESSED, b"{}")).unwrap_err();
    assert_eq!(err.code, Code::InvalidArgument);
    assert!(err.message.contains("compressed"), "{err}");
    let mut reader = RequestStreamDecoder::<StreamInputRequest>::new(Codec::Json, MAX);
    let err = reader.feed(&envelope(FLAG_END_STREAM, b"{}")).unwrap_err();
    assert!(
        err.message.contains("end-stream flag in a client stream"),
        "{err}"
    );
    // A bad message inside a good envelope names its type and field.
    let mut reader = RequestStreamDecoder::<StreamInputRequest>::new(Codec::Json, MAX);
    let err = reader
        .feed(&envelope(0, br#"{"start":{"process":{"pid":"seven"}}}"#))
        .unwrap_err();
    assert!(
        err.message
            .starts_with("process.StreamInputRequest: invalid JSON at `start.process.pid`"),
        "{err}"
    );

    // A server stream that stops without its end frame.
    let mut reader = ResponseStreamDecoder::<StartResponse>::new(Codec::Json, MAX);
    reader
        .feed(&message_frame(Codec::Json, &StartResponse::default()).unwrap())
        .unwrap();
    let err = reader.finish().unwrap_err();
    assert!(
        err.message.contains("without an end-stream envelope"),
        "{err}"
    );
    // An end frame that is not the end message's JSON.
    let mut reader = ResponseStreamDecoder::<StartResponse>::new(Codec::Json, MAX);
    let err = reader.feed(&envelope(FLAG_END_STREAM, b"[1]")).unwrap_err();
    assert!(
        err.message.contains("end-stream message is not valid"),
        "{err}"
    );
}

#[test]
fn refuses_malformed_messages_with_the_field_named() {
    let cases: [(&str, &str); 7] = [
        (
            r#"{"process":{"pid":"abc"}}"#,
            "invalid JSON at `process.pid`",
        ),
        (r#"{"process":{"pid":-1}}"#, "invalid JSON at `process.pid`"),
        (
            r#"{"process":{"pid":42},"signal":"SIGNAL_SIGHUP"}"#,
            "invalid JSON at `signal`",
        ),
        (r#"{"process":{"pid":1,"tag":"x"}}"#, "`process"),
        (
            r#"{"process":{"pid":1}} trailing"#,
            "invalid JSON: trailing characters",
        ),
        (r#"["process"]"#, "invalid JSON"),
        ("", "empty JSON body"),
    ];
    for (body, want) in cases {
        let err = decode_unary::<SendSignalRequest>(Codec::Json, body.as_bytes(), MAX).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("process.SendSignalRequest: "),
            "{body}: {text}"
        );
        assert!(text.contains(want), "{body}: {text}");
        assert_eq!(err.to_connect_error().code, Code::InvalidArgument);
    }
    // A field this node does not know is ignored, as envd's Connect server does.
    let newer: SendSignalRequest =
        json(r#"{"process":{"pid":1},"signal":"SIGNAL_SIGTERM","reason":"later SDK"}"#);
    assert_eq!(newer.signal(), Signal::Sigterm);

    // Binary: a length running past the end, and a wrong wire type.
    let err = decode_unary::<StartRequest>(Codec::Proto, &[0x0a, 0x09, 0x0a], MAX).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("process.StartRequest: invalid protobuf"),
        "{err}"
    );
    // Field 9 (varint) is not in the message: skipped, as protobuf readers do.
    assert!(decode_unary::<StartRequest>(Codec::Proto, &[0x48, 0x01], MAX).is_ok());
    // Field 1 with the wrong wire type.
    assert!(decode_unary::<StartRequest>(Codec::Proto, &[0x08, 0x01], MAX).is_err());
    assert!(decode_unary::<StartRequest>(Codec::Proto, &[0x0d, 0x01], MAX).is_err());

    // Over the size limit, before any parsing.
    let err = decode_unary::<StartRequest>(Codec::Json, &[b' '; 33], 32).unwrap_err();
    assert_eq!(err.to_connect_error().code, Code::ResourceExhausted);
    assert_eq!(
        err.to_string(),
        "process.StartRequest: message of 33 bytes is larger than the limit of 32 bytes"
    );
    // Nesting deeper than the JSON reader's limit is an error, not a stack overflow.
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    assert!(decode_unary::<StartRequest>(Codec::Json, deep.as_bytes(), MAX).is_err());
}

#[test]
fn every_message_round_trips_in_both_codecs() {
    use aegis_e2b::envd::filesystem as fs;
    use aegis_e2b::envd::process as pr;
    let entry = || fs::EntryInfo {
        name: "d".into(),
        r#type: FileType::Directory as i32,
        path: "/home/user/d".into(),
        size: -1,
        mode: 0o40755,
        permissions: "drwxr-xr-x".into(),
        owner: "user".into(),
        group: "user".into(),
        modified_time: Some(aegis_e2b::envd::Timestamp {
            seconds: 1,
            nanos: 7,
        }),
        symlink_target: Some("/x".into()),
        metadata: Default::default(),
    };
    let config = || ProcessConfig {
        cmd: "sleep".into(),
        args: vec!["9".into()],
        envs: Default::default(),
        cwd: None,
    };
    round_trips(&pr::ListResponse {
        processes: vec![pr::ProcessInfo {
            config: Some(config()),
            pid: 3,
            tag: Some("t".into()),
        }],
    });
    round_trips(&pr::ConnectResponse {
        event: Some(ProcessEvent {
            event: Some(process_event::Event::Data(process_event::DataEvent {
                output: Some(process_event::data_event::Output::Stderr(vec![0, 255])),
            })),
        }),
    });
    round_trips(&pr::CloseStdinRequest {
        process: Some(ProcessSelector {
            selector: Some(process_selector::Selector::Tag("t".into())),
        }),
    });
    round_trips(&pr::StartRequest {
        tag: Some("t".into()),
        pty: Some(Pty {
            size: Some(pr::pty::Size { cols: 1, rows: 2 }),
        }),
        ..start_request()
    });
    round_trips(&fs::MoveRequest {
        source: "a".into(),
        destination: "b".into(),
    });
    round_trips(&fs::MoveResponse {
        entry: Some(entry()),
    });
    round_trips(&fs::MakeDirResponse {
        entry: Some(entry()),
    });
    round_trips(&fs::ListDirResponse {
        entries: vec![entry(), EntryInfo::default()],
    });
    round_trips(&fs::CreateWatcherRequest {
        path: "/tmp".into(),
        recursive: true,
        include_entry: false,
        allow_network_mounts: true,
    });
    round_trips(&fs::CreateWatcherResponse {
        watcher_id: "w1".into(),
    });
    round_trips(&fs::GetWatcherEventsRequest {
        watcher_id: "w1".into(),
    });
    round_trips(&fs::RemoveRequest { path: "x".into() });
    round_trips(&fs::StatRequest { path: "x".into() });
    round_trips(&fs::RemoveWatcherResponse {});
    // Defaults: `{}` and no bytes.
    assert_eq!(as_json(&EntryInfo::default()), serde_json::json!({}));
    assert!(encode_unary(Codec::Proto, &EntryInfo::default())
        .unwrap()
        .is_empty());
    // The int64 size as a string, also when negative.
    assert_eq!(as_json(&entry())["size"], "-1");
    assert_eq!(
        as_json(&entry())["modifiedTime"],
        "1970-01-01T00:00:01.000000007Z"
    );
}
