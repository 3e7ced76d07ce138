//! Reading the JSON a node answers: the strings of one field across a list, and a value's text.
//! One home for the `.as_array().unwrap().iter().map(..).collect()` chain the suites otherwise
//! write out at every listing they check.

use serde_json::Value;

/// `field` of every element of the list `list`, each of which must be a string; fails the test,
/// showing what it got, otherwise.
pub fn strs<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    items(list)
        .iter()
        .map(|item| {
            item[field]
                .as_str()
                .unwrap_or_else(|| panic!("no string {field} in {item}"))
        })
        .collect()
}

/// `field` of the elements of the list `list` that have it as a string; the others are passed
/// over (a list of mixed parts, such as results of which only some are images).
pub fn present_strs<'a>(list: &'a Value, field: &str) -> Vec<&'a str> {
    items(list)
        .iter()
        .filter_map(|item| item[field].as_str())
        .collect()
}

/// The element of the list `list` whose `field` is `value`; fails the test, showing the list,
/// when there is none.
pub fn find<'a, V>(list: &'a Value, field: &str, value: V) -> &'a Value
where
    V: std::fmt::Debug,
    Value: PartialEq<V>,
{
    items(list)
        .iter()
        .find(|item| item[field] == value)
        .unwrap_or_else(|| panic!("no {field} = {value:?} in {list}"))
}

/// The elements of the list `list`; fails the test, showing what it got, when it is no list.
pub fn items(list: &Value) -> &[Value] {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
}

/// `value`'s text when it is a string, and "" when it is not (so that a check of what a
/// message says fails on a missing message too).
pub fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

/// `value`, which must be a string, as one of its own; fails the test showing what it was.
pub fn string(value: &Value) -> String {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
        .to_owned()
}
