//! The client capabilities that decide whether a server's request may reach the client:
//! `elicitation`, `sampling`, `roots`. Read from `initialize` (legacy era) or a request's
//! `_meta` (2026-07-28); anything else a client declares is not needed here.

use serde_json::{Value, json};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCaps {
    pub elicitation: bool,
    pub sampling: bool,
    pub roots: bool,
}

impl ClientCaps {
    /// From a `capabilities` object (an object member counts as declared).
    pub fn from_value(caps: Option<&Value>) -> ClientCaps {
        let has = |k: &str| caps.and_then(|c| c.get(k)).is_some_and(Value::is_object);
        ClientCaps {
            elicitation: has("elicitation"),
            sampling: has("sampling"),
            roots: has("roots"),
        }
    }

    /// Whether the capability a method needs (`elicitation`, `sampling`, `roots`) is
    /// declared.
    pub fn has(&self, capability: &str) -> bool {
        match capability {
            "elicitation" => self.elicitation,
            "sampling" => self.sampling,
            "roots" => self.roots,
            _ => false,
        }
    }

    pub fn any(&self) -> bool {
        self.elicitation || self.sampling || self.roots
    }

    /// The capabilities object to declare upstream on the agent's behalf.
    pub fn to_value(self) -> Value {
        let mut out = serde_json::Map::new();
        if self.elicitation {
            out.insert("elicitation".into(), json!({"form": {}}));
        }
        if self.sampling {
            out.insert("sampling".into(), json!({}));
        }
        if self.roots {
            out.insert("roots".into(), json!({}));
        }
        Value::Object(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_and_written() {
        let c = ClientCaps::from_value(Some(
            &json!({"elicitation": {}, "roots": {"listChanged": true}, "sampling": true}),
        ));
        assert!(c.elicitation && c.roots && !c.sampling, "{c:?}");
        assert!(c.has("roots") && !c.has("sampling") && !c.has("tools"));
        assert_eq!(
            c.to_value(),
            json!({"elicitation": {"form": {}}, "roots": {}})
        );
        assert!(!ClientCaps::from_value(None).any());
    }
}
