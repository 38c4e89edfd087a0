//! `#[derive(Module)]` for fucina (re-exported as `fucina::nn::Module`, next
//! to the trait of the same name): implements `fucina::nn::Module` for a
//! struct by listing the parameters of its fields with stable dotted names.
//!
//! Each field is, by its written type:
//!
//! - `Parameter`: one parameter named after the field (`"weight"`);
//! - `Buffer`: one buffer (non-trainable saved state, listed by
//!   `named_buffers`) named after the field;
//! - `Vec<T>` or `[T; N]`: its elements, named `"field.0"`, `"field.1"`, ...
//!   (`"layers.0.weight"`);
//! - `Option<T>`: its value when present, under the field's name;
//! - `Box<T>`: its value;
//! - anything else: a module (a type implementing `Module`), whose names get
//!   the field's name and a dot in front (`"fc1.weight"`).
//!
//! A field holding no parameters (a size, a flag) is marked `#[module(skip)]`.
//! `named_buffers` gathers the buffers of the fields the same way, and `train`
//! is passed on to every module field. Tuple structs name their fields
//! `"0"`, `"1"`, ...; enums and unions are refused.
//!
//! See `fucina::nn::Module` for an example.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::{format_ident, quote};
use syn::{Data, DeriveInput, Fields, GenericArgument, PathArguments, Type, parse_macro_input};

/// Implements `fucina::nn::Module` (`named_parameters`, `named_buffers` and
/// `train`) for a
/// struct from its fields (see the crate documentation for the naming rules
/// and `#[module(skip)]`).
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            &input.ident,
            "#[derive(Module)] supports structs only",
        ));
    };
    let mut collect = Vec::new();
    let mut buffers = Vec::new();
    let mut train = Vec::new();
    let fields: Vec<_> = match &data.fields {
        Fields::Named(f) => f.named.iter().collect(),
        Fields::Unnamed(f) => f.unnamed.iter().collect(),
        Fields::Unit => Vec::new(),
    };
    for (i, field) in fields.into_iter().enumerate() {
        if is_skipped(field)? {
            continue;
        }
        let (member, name) = match &field.ident {
            Some(id) => (quote!(#id), id.to_string()),
            None => {
                let idx = syn::Index::from(i);
                (quote!(#idx), i.to_string())
            }
        };
        let name = quote!(::std::string::String::from(#name));
        collect.push(gen_collect(
            &field.ty,
            quote!(&self.#member),
            name.clone(),
            0,
            Want::Parameters,
        ));
        buffers.push(gen_collect(
            &field.ty,
            quote!(&self.#member),
            name,
            0,
            Want::Buffers,
        ));
        train.push(gen_train(&field.ty, quote!(&mut self.#member), 0));
    }
    let ident = &input.ident;
    let (impl_g, ty_g, where_g) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_g ::fucina::nn::Module for #ident #ty_g #where_g {
            fn named_parameters(&self) -> ::std::vec::Vec<(::std::string::String, ::fucina::nn::Parameter)> {
                let mut __out: ::std::vec::Vec<(::std::string::String, ::fucina::nn::Parameter)> =
                    ::std::vec::Vec::new();
                #(#collect)*
                __out
            }
            fn named_buffers(&self) -> ::std::vec::Vec<(::std::string::String, ::fucina::nn::Buffer)> {
                let mut __out: ::std::vec::Vec<(::std::string::String, ::fucina::nn::Buffer)> =
                    ::std::vec::Vec::new();
                #(#buffers)*
                __out
            }
            fn train(&mut self, training: bool) {
                let _ = training;
                #(#train)*
            }
        }
    })
}

/// Whether the field carries `#[module(skip)]` (any other `module(...)`
/// argument is an error).
fn is_skipped(field: &syn::Field) -> syn::Result<bool> {
    let mut skip = false;
    for attr in &field.attrs {
        if !attr.path().is_ident("module") {
            continue;
        }
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("skip") {
                skip = true;
                Ok(())
            } else {
                Err(meta.error("unknown #[module] argument (expected `skip`)"))
            }
        })?;
    }
    Ok(skip)
}

/// What a written type is, for naming.
enum Kind<'a> {
    Parameter,
    Buffer,
    Seq(&'a Type),
    Opt(&'a Type),
    Boxed(&'a Type),
    Module,
}

fn kind(ty: &Type) -> Kind<'_> {
    match ty {
        Type::Array(a) => Kind::Seq(&a.elem),
        Type::Group(g) => kind(&g.elem),
        Type::Paren(p) => kind(&p.elem),
        Type::Path(p) if p.qself.is_none() => {
            let Some(last) = p.path.segments.last() else {
                return Kind::Module;
            };
            let arg = match &last.arguments {
                PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
                    GenericArgument::Type(t) => Some(t),
                    _ => None,
                },
                _ => None,
            };
            match (last.ident.to_string().as_str(), arg) {
                ("Parameter", None) => Kind::Parameter,
                ("Buffer", None) => Kind::Buffer,
                ("Vec", Some(t)) => Kind::Seq(t),
                ("Option", Some(t)) => Kind::Opt(t),
                ("Box", Some(t)) => Kind::Boxed(t),
                _ => Kind::Module,
            }
        }
        _ => Kind::Module,
    }
}

/// What [`gen_collect`] gathers.
#[derive(Clone, Copy, PartialEq)]
enum Want {
    Parameters,
    Buffers,
}

/// Code pushing the parameters (or buffers) of `expr` (a `&T`) named under
/// `name` (a `String` expression) onto `__out`.
fn gen_collect(ty: &Type, expr: Tokens, name: Tokens, depth: usize, want: Want) -> Tokens {
    let x = format_ident!("__x{depth}");
    let n = format_ident!("__n{depth}");
    match kind(ty) {
        Kind::Parameter if want == Want::Parameters => quote! {
            __out.push((#name, ::std::clone::Clone::clone(#expr)));
        },
        Kind::Buffer if want == Want::Buffers => quote! {
            __out.push((#name, ::std::clone::Clone::clone(#expr)));
        },
        Kind::Parameter | Kind::Buffer => quote!(),
        Kind::Seq(t) => {
            let inner = gen_collect(
                t,
                quote!(#x),
                quote!(::std::format!("{}.{}", #n, __i)),
                depth + 1,
                want,
            );
            quote! {
                let #n: ::std::string::String = #name;
                for (__i, #x) in ::std::iter::IntoIterator::into_iter(#expr).enumerate() {
                    #inner
                }
            }
        }
        Kind::Opt(t) => {
            let inner = gen_collect(t, quote!(#x), name, depth + 1, want);
            quote! {
                if let ::std::option::Option::Some(#x) = ::std::option::Option::as_ref(#expr) {
                    #inner
                }
            }
        }
        Kind::Boxed(t) => {
            let inner = gen_collect(t, quote!(#x), name, depth + 1, want);
            quote! {
                {
                    let #x = &**#expr;
                    #inner
                }
            }
        }
        Kind::Module => {
            let method = match want {
                Want::Parameters => quote!(named_parameters),
                Want::Buffers => quote!(named_buffers),
            };
            quote! {
                {
                    let #n: ::std::string::String = #name;
                    for (__k, __p) in ::fucina::nn::Module::#method(#expr) {
                        __out.push((::std::format!("{}.{}", #n, __k), __p));
                    }
                }
            }
        }
    }
}

/// Code passing `train(training)` to the modules in `expr` (a `&mut T`).
fn gen_train(ty: &Type, expr: Tokens, depth: usize) -> Tokens {
    let x = format_ident!("__x{depth}");
    match kind(ty) {
        Kind::Parameter | Kind::Buffer => quote!(),
        Kind::Seq(t) => {
            let inner = gen_train(t, quote!(#x), depth + 1);
            quote! {
                for #x in ::std::iter::IntoIterator::into_iter(#expr) {
                    #inner
                }
            }
        }
        Kind::Opt(t) => {
            let inner = gen_train(t, quote!(#x), depth + 1);
            quote! {
                if let ::std::option::Option::Some(#x) = ::std::option::Option::as_mut(#expr) {
                    #inner
                }
            }
        }
        Kind::Boxed(t) => {
            let inner = gen_train(t, quote!(#x), depth + 1);
            quote! {
                {
                    let #x = &mut **#expr;
                    #inner
                }
            }
        }
        Kind::Module => quote! {
            ::fucina::nn::Module::train(#expr, training);
        },
    }
}
