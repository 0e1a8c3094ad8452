pub mod devserver;
