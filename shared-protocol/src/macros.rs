//! `wire_enum!`: a closed enum of snake_case wire names with `as_str`,
//! `Display`, `FromStr` and `ALL`, so a wire name is written exactly once.

/// Declares a closed wire enum. Each variant is given with its wire name:
///
/// ```ignore
/// wire_enum! {
///     /// docs
///     pub enum LeaseMode { Exclusive = "exclusive", SharedRead = "shared_read" }
/// }
/// ```
#[macro_export]
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $wire:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord,
                 serde::Serialize, serde::Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $wire)] $variant ),+
        }

        impl $name {
            /// Every value, in declaration (seed) order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant ),+ ];

            /// The wire name.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $wire ),+ }
            }
        }

        // By hand: the wire names reach the derive as macro fragments,
        // which its `serde(rename)` reading does not see.
        impl $crate::utoipa::PartialSchema for $name {
            /// A string, one of the wire names.
            fn schema() -> $crate::utoipa::openapi::RefOr<$crate::utoipa::openapi::schema::Schema> {
                $crate::utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type($crate::utoipa::openapi::schema::Type::String)
                    .enum_values(Some([$( $wire ),+]))
                    .into()
            }
        }

        impl $crate::utoipa::ToSchema for $name {}

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::validate::ValidationError;
            /// Parse a wire name; the error lists the accepted values.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $wire => Ok($name::$variant), )+
                    other => Err($crate::validate::ValidationError::new(
                        stringify!($name),
                        format!("unknown value `{other}`, expected one of: {}",
                                [$( $wire ),+].join(", ")),
                    )),
                }
            }
        }
    };
}
