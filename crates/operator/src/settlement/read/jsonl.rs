//! A JSON-lines report read line by line: each line one JSON object,
//! nested objects flattened with dots (`metadata.operation_key`). A name
//! the line gives no single value for is sent as unreadable, with why,
//! never as one of its values picked: a name given twice (`{"a.b": 1,
//! "a": {"b": 2}}`, or one key twice in an object), a JSON array, or an
//! object where the provider's settings read a value. The coordinator
//! refuses the line, by its number, when one of those is a column the
//! provider's settings read (docs/settlement.md).

use super::Read1;
use jobfence_api::v1::{RefusedLine, SettlementReportLine};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::collections::HashMap;
use std::io::BufRead;

pub(super) fn read_jsonl(
    input: Box<dyn BufRead + Send>,
    each: &mut dyn FnMut(Read1) -> bool,
) -> anyhow::Result<()> {
    for (i, line) in input.split(b'\n').enumerate() {
        let number = i as u64 + 1;
        let line = line.map_err(|e| {
            anyhow::Error::new(e).context(format!("reading the report after line {}", number - 1))
        })?;
        let refused = |reason: String| {
            Read1::Refused(RefusedLine {
                line: number,
                field: "line".into(),
                reason,
            })
        };
        let Ok(line) = String::from_utf8(line) else {
            if !each(refused("not UTF-8 text".into())) {
                break;
            }
            continue;
        };
        let text = line.trim_start_matches('\u{feff}').trim();
        if text.is_empty() {
            continue;
        }
        let next = match flatten(text) {
            Ok(Some(flat)) => Read1::Line(SettlementReportLine {
                line: number,
                fields: flat.fields,
                unreadable: flat.unreadable,
            }),
            Ok(None) => refused("not a JSON object".into()),
            Err(e) => refused(format!("not JSON: {e}")),
        };
        if !each(next) {
            break;
        }
    }
    Ok(())
}

/// One line's names: the scalars by their dotted paths (nulls left out),
/// and the names with no single value, with why.
#[derive(Debug, Default, PartialEq)]
struct Flat {
    fields: HashMap<String, String>,
    unreadable: HashMap<String, String>,
}

impl Flat {
    /// A value at `name`; a second one makes the name unreadable.
    fn put(&mut self, name: String, value: String) {
        if let Some(why) = self.unreadable.get_mut(&name) {
            *why = Self::TWICE.into();
            return;
        }
        if self.fields.contains_key(&name) {
            self.fields.remove(&name);
            self.unreadable.insert(name, Self::TWICE.into());
            return;
        }
        self.fields.insert(name, value);
    }

    /// Something at `name` that is not one value (`why`).
    fn not_a_value(&mut self, name: String, why: &str) {
        let why = if self.fields.remove(&name).is_some() {
            Self::TWICE
        } else {
            why
        };
        self.unreadable.entry(name).or_insert_with(|| why.into());
    }

    const TWICE: &'static str = "is given more than once in the line (a dotted key and a \
                                 nested one, or one key twice): which value is meant cannot be told";
}

/// The line flattened; `None` when it is JSON but not an object.
fn flatten(text: &str) -> serde_json::Result<Option<Flat>> {
    let mut flat = Flat::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let object = Names {
        prefix: None,
        flat: &mut flat,
    }
    .deserialize(&mut de)?;
    de.end()?;
    Ok(object.then_some(flat))
}

/// Visits one value named `prefix` (`None`: the line itself), writing
/// what it holds into `flat`; answers whether the value was an object.
struct Names<'a> {
    prefix: Option<String>,
    flat: &'a mut Flat,
}

impl Names<'_> {
    fn name(&self) -> String {
        self.prefix.clone().unwrap_or_default()
    }

    fn scalar<E>(self, value: String) -> Result<bool, E> {
        if self.prefix.is_some() {
            let name = self.name();
            self.flat.put(name, value);
        }
        Ok(false)
    }
}

impl<'de> DeserializeSeed<'de> for Names<'_> {
    type Value = bool;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Names<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        if let Some(name) = &self.prefix {
            self.flat
                .not_a_value(name.clone(), "holds a JSON object, not one value");
        }
        while let Some(key) = map.next_key::<String>()? {
            let name = match &self.prefix {
                Some(p) => format!("{p}.{key}"),
                None => key,
            };
            map.next_value_seed(Names {
                prefix: Some(name),
                flat: self.flat,
            })?;
        }
        Ok(true)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        if self.prefix.is_some() {
            let name = self.name();
            self.flat
                .not_a_value(name, "holds a JSON array, not one value");
        }
        Ok(false)
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false) // null: left out, as a value not given
    }

    fn visit_str<E>(self, v: &str) -> Result<bool, E> {
        self.scalar(v.to_owned())
    }

    fn visit_string<E>(self, v: String) -> Result<bool, E> {
        self.scalar(v)
    }

    fn visit_bool<E>(self, v: bool) -> Result<bool, E> {
        self.scalar(v.to_string())
    }

    fn visit_i64<E>(self, v: i64) -> Result<bool, E> {
        self.scalar(v.to_string())
    }

    fn visit_u64<E>(self, v: u64) -> Result<bool, E> {
        self.scalar(v.to_string())
    }

    fn visit_f64<E>(self, v: f64) -> Result<bool, E> {
        // As JSON writes it (`10.0`, not `10`): an amount in minor units
        // written as a decimal is refused, not read as a whole number.
        let text = serde_json::Number::from_f64(v).map_or_else(|| v.to_string(), |n| n.to_string());
        self.scalar(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flat(text: &str) -> Flat {
        flatten(text).unwrap().unwrap()
    }

    #[test]
    fn nested_objects_flatten_with_dots_and_nulls_are_left_out() {
        let f = flat(
            r#"{"id":"re_1","amount":1000,"f":10.0,"ok":true,"metadata":{"operation_key":"k"},"reason":null}"#,
        );
        let mut names: Vec<(&str, &str)> = f
            .fields
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("amount", "1000"),
                ("f", "10.0"),
                ("id", "re_1"),
                ("metadata.operation_key", "k"),
                ("ok", "true")
            ]
        );
        assert_eq!(
            f.unreadable.keys().collect::<Vec<_>>(),
            ["metadata"],
            "an object is no value of its own"
        );
        assert_eq!(flatten("[1]").unwrap(), None);
        assert!(flatten("{\"id\":1} x").is_err());
    }

    /// Two values for one name are neither of them: the name is sent as
    /// unreadable, whichever way the line wrote it twice.
    #[test]
    fn a_name_given_twice_has_no_value() {
        for text in [
            r#"{"a.b":1,"a":{"b":2},"id":"re_1"}"#,
            r#"{"a":{"b":2},"a.b":1,"id":"re_1"}"#,
            r#"{"a":{"b":1,"b":2},"id":"re_1"}"#,
            r#"{"a.b":1,"a.b":1,"id":"re_1"}"#,
            r#"{"a.b":{"c":1},"a":{"b":2},"id":"re_1"}"#,
        ] {
            let f = flat(text);
            assert!(!f.fields.contains_key("a.b"), "{text}: {f:?}");
            assert!(
                f.unreadable["a.b"].contains("more than once"),
                "{text}: {f:?}"
            );
            assert_eq!(f.fields["id"], "re_1", "{text}");
        }
    }

    #[test]
    fn an_array_has_no_value() {
        let f = flat(r#"{"id":"re_1","metadata":{"operation_key":["k1","k2"]},"tags":[]}"#);
        assert!(!f.fields.contains_key("metadata.operation_key"));
        assert!(f.unreadable["metadata.operation_key"].contains("array"));
        assert!(f.unreadable["tags"].contains("array"));
    }
}
