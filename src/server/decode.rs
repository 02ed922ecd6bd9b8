//! Request decoding driven by the request types' own schemas (the utoipa derive of the one parameter
//! struct), so that no field list is kept by hand:
//! - JSON bodies are checked for unknown fields (serde cannot deny them through `flatten`);
//! - text values (multipart parts, query parameters) become JSON by the type of the field they fill: string
//!   fields stay strings, numbers and booleans parse from their text, object-valued fields are JSON text;
//! - `GET /search`'s OpenAPI parameters are `SearchRequest`'s scalar fields.

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;

use axum::extract::{FromRequest, Request};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use utoipa::openapi::path::{Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::{RefOr, Required, Schema};
use utoipa::ToSchema;

use super::error::{ApiError, ErrorCode};

/// How a field's text value becomes JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A string (or a string enum): the text as is.
    Text,
    /// A number or a boolean: the text parsed as JSON.
    Scalar,
    /// An object or an array: the text is its JSON.
    Object,
}

/// One field of a request type: its kind, whether it is required, and its schema (for documentation).
#[derive(Debug, Clone)]
pub struct Field {
    pub kind: Kind,
    pub required: bool,
    schema: Value,
}

/// The top-level fields of a request type, flattened parts included.
pub struct Fields(BTreeMap<String, Field>);

impl Fields {
    /// The fields of `T`, worked out once per type.
    pub fn of<T: ToSchema>() -> &'static Fields {
        static CACHE: OnceLock<Mutex<HashMap<String, &'static Fields>>> = OnceLock::new();
        let name = T::name().into_owned();
        let mut cache = CACHE.get_or_init(Mutex::default).lock();
        cache.entry(name).or_insert_with(|| Box::leak(Box::new(Fields::from_schema::<T>())))
    }

    fn from_schema<T: ToSchema>() -> Fields {
        let mut referenced = Vec::new();
        T::schemas(&mut referenced);
        let components: HashMap<String, Value> = referenced
            .into_iter()
            .map(|(name, schema)| (name, serde_json::to_value(schema).unwrap_or_default()))
            .collect();
        let walker = Walker { components };
        let mut fields = BTreeMap::new();
        walker.properties(&serde_json::to_value(T::schema()).unwrap_or_default(), &mut fields);
        Fields(fields)
    }

    pub fn get(&self, name: &str) -> Option<&Field> {
        self.0.get(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The first key of a JSON object that names no field.
    pub fn unknown<'a>(&self, object: &'a Map<String, Value>) -> Option<&'a str> {
        object.keys().map(String::as_str).find(|k| !self.0.contains_key(*k))
    }

    /// Named text values as a JSON object, each decoded by its field's kind. A name given twice is
    /// `duplicate_field`; an unknown name or undecodable text is `code`; so is an object-valued field when
    /// `objects` is false (query strings carry scalars only).
    pub fn decode(
        &self,
        pairs: impl IntoIterator<Item = (String, String)>,
        objects: bool,
        code: ErrorCode,
    ) -> Result<Map<String, Value>, ApiError> {
        let mut object = Map::new();
        for (name, text) in pairs {
            if object.contains_key(&name) {
                return Err(ApiError::new(
                    ErrorCode::DuplicateField,
                    format!("field `{name}` is given more than once"),
                ));
            }
            let Some(field) = self.get(&name) else {
                let known: Vec<&str> = self.names().collect();
                let message = format!("unknown field `{name}`; expected one of {}", known.join(", "));
                return Err(ApiError::new(code, message));
            };
            let value = match field.kind {
                Kind::Text => Value::String(text),
                Kind::Object if !objects => {
                    let message = format!("`{name}` is an object: send it in a JSON body (POST) instead");
                    return Err(ApiError::new(code, message));
                }
                Kind::Scalar | Kind::Object => serde_json::from_str(&text)
                    .map_err(|e| ApiError::new(code, format!("field `{name}`: {text:?} is not valid here: {e}")))?,
            };
            object.insert(name, value);
        }
        Ok(object)
    }

    /// OpenAPI query parameters for the scalar fields (`rename` maps a field to its parameter name).
    pub fn query_parameters(&self, rename: &[(&str, &str)]) -> Vec<Parameter> {
        self.0
            .iter()
            .filter(|(_, f)| f.kind != Kind::Object)
            .map(|(name, field)| {
                let name = rename.iter().find(|(from, _)| from == name).map_or(name.as_str(), |(_, to)| to);
                let description = field.schema.get("description").and_then(Value::as_str).map(String::from);
                let schema: Option<RefOr<Schema>> = serde_json::from_value(field.schema.clone()).ok();
                ParameterBuilder::new()
                    .name(name)
                    .parameter_in(ParameterIn::Query)
                    .required(if field.required { Required::True } else { Required::False })
                    .description(description)
                    .schema(schema)
                    .build()
            })
            .collect()
    }
}

/// Other servers' names for a field, read as the field's own (the schema has one name per field): sglang's
/// `instruct`.
const ALIASES: [(&str, &str); 1] = [("instruct", "instruction")];

/// Decodes a JSON object into `T` after refusing fields `T` does not have (an alias of one of its fields is
/// that field; both given is `duplicate_field`).
pub fn from_object<T: ToSchema + DeserializeOwned>(
    mut object: Map<String, Value>,
    code: ErrorCode,
) -> Result<T, ApiError> {
    let fields = Fields::of::<T>();
    for (alias, name) in ALIASES {
        if fields.get(name).is_none() || !object.contains_key(alias) {
            continue;
        }
        if object.contains_key(name) {
            return Err(ApiError::new(ErrorCode::DuplicateField, format!("`{alias}` and `{name}` are one field")));
        }
        let value = object.remove(alias).expect("present");
        object.insert(name.to_string(), value);
    }
    if let Some(unknown) = fields.unknown(&object) {
        let known: Vec<&str> = fields.names().collect();
        return Err(ApiError::new(code, format!("unknown field `{unknown}`; expected one of {}", known.join(", "))));
    }
    serde_json::from_value(Value::Object(object)).map_err(|e| ApiError::new(code, e.to_string()))
}

/// A JSON body decoded into `T`, fields `T` does not have refused.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: ToSchema + DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let axum::Json(Checked { value, repeated }) = axum::Json::<Checked>::from_request(request, state).await?;
        if let Some(name) = repeated {
            return Err(ApiError::new(ErrorCode::DuplicateField, format!("field `{name}` is given more than once")));
        }
        match value {
            Value::Object(object) => from_object(object, ErrorCode::InvalidBody).map(ApiJson),
            _ => Err(ApiError::new(ErrorCode::InvalidBody, "the body must be a JSON object")),
        }
    }
}

/// A JSON value, and the first key that an object in it (at any depth) names twice: serde_json's `Value` keeps
/// the last silently, and a request must not mean something other than what its sender may have read in it.
struct Checked {
    value: Value,
    repeated: Option<String>,
}

impl Checked {
    fn of(value: Value) -> Checked {
        Checked { value, repeated: None }
    }
}

impl<'de> serde::Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Checked, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> serde::de::Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Checked, E> {
        Ok(Checked::of(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Checked, E> {
        Ok(Checked::of(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Checked, E> {
        Ok(Checked::of(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Checked, E> {
        Ok(Checked::of(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Checked, E> {
        Ok(Checked::of(Value::String(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Checked, E> {
        Ok(Checked::of(Value::String(v)))
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked::of(Value::Null))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        let (mut values, mut repeated) = (Vec::new(), None);
        while let Some(Checked { value, repeated: inner }) = seq.next_element::<Checked>()? {
            repeated = repeated.or(inner);
            values.push(value);
        }
        Ok(Checked { value: Value::Array(values), repeated })
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        let (mut object, mut repeated) = (Map::new(), None);
        while let Some(key) = map.next_key::<String>()? {
            let Checked { value, repeated: inner } = map.next_value::<Checked>()?;
            if object.contains_key(&key) {
                repeated = repeated.or(Some(key.clone()));
            }
            repeated = repeated.or(inner);
            object.insert(key, value);
        }
        Ok(Checked { value: Value::Object(object), repeated })
    }
}

/// Query-string parameters decoded into `T` by `T`'s fields (`rename`: parameter name to field name); scalar
/// fields only.
pub fn from_query<T: ToSchema + DeserializeOwned>(
    pairs: Vec<(String, String)>,
    rename: &[(&str, &str)],
) -> Result<T, ApiError> {
    let pairs = pairs.into_iter().map(|(name, value)| {
        let name = rename.iter().find(|(from, _)| *from == name).map_or(name, |(_, to)| to.to_string());
        (name, value)
    });
    let object = Fields::of::<T>().decode(pairs, false, ErrorCode::InvalidQueryString)?;
    from_object(object, ErrorCode::InvalidQueryString)
}

/// Walks schemas as JSON, resolving references to the components the type names.
struct Walker {
    components: HashMap<String, Value>,
}

impl Walker {
    fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match schema.get("$ref").and_then(Value::as_str) {
            Some(reference) => {
                let name = reference.rsplit('/').next().unwrap_or_default();
                self.components.get(name).map_or(schema, |s| self.resolve(s))
            }
            None => schema,
        }
    }

    /// Collects the properties of an object schema, through `allOf` (serde's `flatten`) and references.
    fn properties(&self, schema: &Value, out: &mut BTreeMap<String, Field>) {
        let schema = self.resolve(schema);
        for part in schema.get("allOf").and_then(Value::as_array).into_iter().flatten() {
            self.properties(part, out);
        }
        let required: Vec<&str> =
            schema.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        for (name, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
            let field = Field {
                kind: self.kind(property),
                required: required.contains(&name.as_str()),
                schema: property.clone(),
            };
            out.insert(name.clone(), field);
        }
    }

    fn kind(&self, schema: &Value) -> Kind {
        let schema = self.resolve(schema);
        let alternatives = schema.get("oneOf").or_else(|| schema.get("anyOf")).and_then(Value::as_array);
        if let Some(alternatives) = alternatives {
            let kinds: Vec<Kind> = alternatives.iter().filter(|a| !is_null(a)).map(|a| self.kind(a)).collect();
            return match kinds.as_slice() {
                [one] => *one,
                kinds if kinds.iter().all(|k| *k == Kind::Text) && !kinds.is_empty() => Kind::Text,
                _ => Kind::Object,
            };
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
            _ if schema.get("enum").is_some() => vec!["string"],
            _ => vec!["object"],
        };
        match types.as_slice() {
            ["string"] => Kind::Text,
            ["integer"] | ["number"] | ["boolean"] => Kind::Scalar,
            _ => Kind::Object,
        }
    }
}

fn is_null(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("null")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_keys_given_twice_at_any_depth_are_found() {
        let checked = |text: &str| serde_json::from_str::<Checked>(text).unwrap();
        let once = checked(r#"{"query": "a", "bm25": {"k1": 1.2, "b": 0.4}, "ids": [{"x": 1}, {"x": 2}], "n": null}"#);
        assert_eq!(once.repeated, None);
        let expected =
            serde_json::json!({"query": "a", "bm25": {"k1": 1.2, "b": 0.4}, "ids": [{"x": 1}, {"x": 2}], "n": null});
        assert_eq!(once.value, expected);
        assert_eq!(checked(r#"{"query": "a", "query": "b"}"#).repeated.as_deref(), Some("query"));
        assert_eq!(checked(r#"{"bm25": {"k1": 1, "k1": 2}}"#).repeated.as_deref(), Some("k1"));
        assert_eq!(checked(r#"[{"id": 1, "id": 2}]"#).repeated.as_deref(), Some("id"));
        assert_eq!(checked("-5").value, serde_json::json!(-5));
        assert_eq!(checked("18446744073709551615").value, serde_json::json!(u64::MAX));
    }

    #[test]
    fn text_values_decode_by_kind_and_duplicates_and_unknowns_are_refused() {
        // A batch's parameters (`BatchRequest` adds the files).
        let fields = Fields::of::<crate::rank::BatchParams>();
        let pairs = |p: &[(&str, &str)]| p.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<Vec<_>>();
        let object = fields
            .decode(pairs(&[("k", "5"), ("tag", "123"), ("bm25", r#"{"k1": 1.2}"#)]), true, ErrorCode::InvalidBody)
            .unwrap();
        assert_eq!(Value::Object(object), serde_json::json!({"k": 5, "tag": "123", "bm25": {"k1": 1.2}}));
        let twice = fields.decode(pairs(&[("k", "5"), ("k", "6")]), true, ErrorCode::InvalidBody).unwrap_err();
        assert_eq!(twice.code, ErrorCode::DuplicateField);
        let unknown = fields.decode(pairs(&[("kk", "5")]), true, ErrorCode::InvalidBody).unwrap_err();
        assert!(unknown.message.contains("unknown field `kk`"), "{}", unknown.message);
        let object = fields.decode(pairs(&[("bm25", "{}")]), false, ErrorCode::InvalidQueryString).unwrap_err();
        assert_eq!(object.code, ErrorCode::InvalidQueryString);
        assert!(object.message.contains("`bm25` is an object"), "{}", object.message);
    }
}
