//! Lexer and parser (placeholder).
