#include "interop/torch_state.h"

#include <openssl/evp.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <variant>
#include <vector>

namespace olmoref::interop {

namespace {

uint32_t le32(const std::string& s, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, s.data() + at, 4);
  return v;
}
uint16_t le16(const std::string& s, size_t at) {
  uint16_t v = 0;
  std::memcpy(&v, s.data() + at, 2);
  return v;
}

// The bytes of the archive entry whose name ends in "/data.pkl" (or is "data.pkl").
std::string pickle_entry(const std::string& z, const std::string& path) {
  if (z.size() < 22) throw std::runtime_error(path + ": not a torch.save archive (too short for a zip file)");
  size_t eocd = std::string::npos;
  for (size_t i = z.size() - 22 + 1; i-- > 0 && z.size() - i < 65536 + 22;) {
    if (le32(z, i) == 0x06054b50u) {
      eocd = i;
      break;
    }
  }
  if (eocd == std::string::npos)
    throw std::runtime_error(path + ": not a torch.save archive (no zip directory; an old non-zip torch file?)");
  const uint16_t entries = le16(z, eocd + 10);
  size_t at = le32(z, eocd + 16);
  if (le32(z, eocd + 16) == 0xffffffffu) throw std::runtime_error(path + ": a zip64 archive (over 4 GiB) is not read");
  for (uint16_t e = 0; e < entries; ++e) {
    if (at + 46 > z.size() || le32(z, at) != 0x02014b50u) throw std::runtime_error(path + ": damaged zip directory");
    const uint16_t method = le16(z, at + 10), name_len = le16(z, at + 28), extra_len = le16(z, at + 30),
                   comment_len = le16(z, at + 32);
    const uint32_t size = le32(z, at + 20), local = le32(z, at + 42);
    const std::string name = z.substr(at + 46, name_len);
    at += 46 + name_len + extra_len + comment_len;
    if (name != "data.pkl" && (name.size() < 9 || name.compare(name.size() - 9, 9, "/data.pkl") != 0)) continue;
    if (method != 0)
      throw std::runtime_error(path + ": " + name + " is compressed (method " + std::to_string(method) +
                               "); torch.save stores entries uncompressed");
    if (local + 30 > z.size() || le32(z, local) != 0x04034b50u) throw std::runtime_error(path + ": damaged zip entry " + name);
    const size_t data = local + 30 + le16(z, local + 26) + le16(z, local + 28);
    if (data + size > z.size()) throw std::runtime_error(path + ": truncated zip entry " + name);
    return z.substr(data, size);
  }
  throw std::runtime_error(path + ": no data.pkl in the archive (not written by torch.save?)");
}

// A pickle value. Containers are shared, as the pickle memo shares them.
struct Obj;
using Val = std::shared_ptr<Obj>;
struct Obj {
  enum Kind { none, boolean, integer, real, str, bytes, list, tuple, dict, object, mark } kind = none;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;               // str, bytes, object (its class)
  std::vector<Val> items;      // list, tuple
  std::vector<std::pair<Val, Val>> entries;  // dict, in insertion order
};
Val make(Obj::Kind k) {
  auto v = std::make_shared<Obj>();
  v->kind = k;
  return v;
}

nlohmann::json to_json(const Val& v, int depth = 0) {
  if (depth > 200) throw std::runtime_error("nested too deeply");
  switch (v->kind) {
    case Obj::none: return nullptr;
    case Obj::boolean: return v->b;
    case Obj::integer: return v->i;
    case Obj::real: return v->d;
    case Obj::str: return v->s;
    case Obj::bytes: return {{"__bytes__", v->s.size()}};
    case Obj::list:
    case Obj::tuple: {
      nlohmann::json a = nlohmann::json::array();
      for (const Val& x : v->items) a.push_back(to_json(x, depth + 1));
      return a;
    }
    case Obj::dict: {
      nlohmann::json o = nlohmann::json::object();
      for (const auto& [k, x] : v->entries) {
        const std::string key = k->kind == Obj::str ? k->s : k->kind == Obj::integer ? std::to_string(k->i) : to_json(k).dump();
        o[key] = to_json(x, depth + 1);
      }
      return o;
    }
    case Obj::object: return {{"__object__", v->s}};
    case Obj::mark: break;
  }
  throw std::runtime_error("a pickle MARK where a value belongs");
}

Val unpickle(const std::string& p, const std::string& path) {
  std::vector<Val> stack;
  std::vector<size_t> marks;
  std::map<uint64_t, Val> memo;
  size_t at = 0;
  auto need = [&](size_t n) {
    if (at + n > p.size()) throw std::runtime_error(path + ": truncated pickle");
  };
  auto pop = [&]() {
    if (stack.empty()) throw std::runtime_error(path + ": pickle stack underflow");
    Val v = stack.back();
    stack.pop_back();
    return v;
  };
  auto pop_mark = [&]() {
    if (marks.empty()) throw std::runtime_error(path + ": pickle MARK missing");
    const size_t m = marks.back();
    marks.pop_back();
    std::vector<Val> items(stack.begin() + static_cast<std::ptrdiff_t>(m), stack.end());
    stack.resize(m);
    return items;
  };
  auto uint = [&](size_t n) {
    need(n);
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[at + k])) << (8 * k);
    at += n;
    return v;
  };
  auto text = [&](size_t n, Obj::Kind k) {
    need(n);
    Val v = make(k);
    v->s = p.substr(at, n);
    at += n;
    stack.push_back(v);
  };
  auto line = [&]() {
    const size_t e = p.find('\n', at);
    if (e == std::string::npos) throw std::runtime_error(path + ": truncated pickle");
    std::string s = p.substr(at, e - at);
    at = e + 1;
    return s;
  };
  auto integer = [&](int64_t i) {
    Val v = make(Obj::integer);
    v->i = i;
    stack.push_back(v);
  };
  for (;;) {
    need(1);
    const uint8_t op = static_cast<uint8_t>(p[at++]);
    switch (op) {
      case 0x80: uint(1); break;                   // PROTO
      case 0x95: uint(8); break;                   // FRAME
      case '.': {                                  // STOP
        if (stack.size() != 1) throw std::runtime_error(path + ": pickle ends with " + std::to_string(stack.size()) + " values");
        return stack.back();
      }
      case '(': marks.push_back(stack.size()); break;
      case '}': stack.push_back(make(Obj::dict)); break;
      case ']': stack.push_back(make(Obj::list)); break;
      case ')': stack.push_back(make(Obj::tuple)); break;
      case 'N': stack.push_back(make(Obj::none)); break;
      case 0x88:
      case 0x89: {
        Val v = make(Obj::boolean);
        v->b = op == 0x88;
        stack.push_back(v);
        break;
      }
      case 'J': integer(static_cast<int32_t>(uint(4))); break;
      case 'K': integer(static_cast<int64_t>(uint(1))); break;
      case 'M': integer(static_cast<int64_t>(uint(2))); break;
      case 0x8a:                                   // LONG1
      case 0x8b: {                                 // LONG4
        const size_t n = static_cast<size_t>(uint(op == 0x8a ? 1 : 4));
        if (n > 8) throw std::runtime_error(path + ": an integer of " + std::to_string(n) + " bytes");
        uint64_t v = uint(n);
        if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
        integer(static_cast<int64_t>(v));
        break;
      }
      case 'G': {
        need(8);
        uint64_t bits = 0;
        for (int k = 0; k < 8; ++k) bits = bits << 8 | static_cast<uint8_t>(p[at + static_cast<size_t>(k)]);
        at += 8;
        Val v = make(Obj::real);
        std::memcpy(&v->d, &bits, 8);
        stack.push_back(v);
        break;
      }
      case 'X': text(static_cast<size_t>(uint(4)), Obj::str); break;
      case 0x8c: text(static_cast<size_t>(uint(1)), Obj::str); break;
      case 0x8d: text(static_cast<size_t>(uint(8)), Obj::str); break;
      case 'U': text(static_cast<size_t>(uint(1)), Obj::bytes); break;
      case 'T': text(static_cast<size_t>(uint(4)), Obj::bytes); break;
      case 'C': text(static_cast<size_t>(uint(1)), Obj::bytes); break;
      case 'B': text(static_cast<size_t>(uint(4)), Obj::bytes); break;
      case 0x8e: text(static_cast<size_t>(uint(8)), Obj::bytes); break;
      case 'q': memo[uint(1)] = stack.empty() ? throw std::runtime_error(path + ": BINPUT on an empty stack") : stack.back(); break;
      case 'r': memo[uint(4)] = stack.empty() ? throw std::runtime_error(path + ": BINPUT on an empty stack") : stack.back(); break;
      case 0x94: memo[memo.size()] = stack.empty() ? throw std::runtime_error(path + ": MEMOIZE on an empty stack") : stack.back(); break;
      case 'h':
      case 'j': {
        const uint64_t k = uint(op == 'h' ? 1 : 4);
        const auto it = memo.find(k);
        if (it == memo.end()) throw std::runtime_error(path + ": pickle memo " + std::to_string(k) + " unset");
        stack.push_back(it->second);
        break;
      }
      case 't': {
        Val v = make(Obj::tuple);
        v->items = pop_mark();
        stack.push_back(v);
        break;
      }
      case 0x85:
      case 0x86:
      case 0x87: {
        Val v = make(Obj::tuple);
        v->items.resize(op - 0x84u);
        for (size_t k = v->items.size(); k-- > 0;) v->items[k] = pop();
        stack.push_back(v);
        break;
      }
      case 's': {
        Val x = pop(), k = pop(), d = pop();
        if (d->kind == Obj::dict) d->entries.emplace_back(k, x);
        stack.push_back(d);
        break;
      }
      case 'u': {
        std::vector<Val> items = pop_mark();
        Val d = pop();
        if (items.size() % 2) throw std::runtime_error(path + ": SETITEMS with an odd count");
        if (d->kind == Obj::dict)
          for (size_t k = 0; k < items.size(); k += 2) d->entries.emplace_back(items[k], items[k + 1]);
        stack.push_back(d);
        break;
      }
      case 'a': {
        Val x = pop(), l = pop();
        if (l->kind == Obj::list) l->items.push_back(x);
        stack.push_back(l);
        break;
      }
      case 'e': {
        std::vector<Val> items = pop_mark();
        Val l = pop();
        if (l->kind == Obj::list) l->items.insert(l->items.end(), items.begin(), items.end());
        stack.push_back(l);
        break;
      }
      case 'c': {                                  // GLOBAL: a class or function, kept by name
        const std::string module = line(), name = line();
        Val v = make(Obj::object);
        v->s = module + "." + name;
        stack.push_back(v);
        break;
      }
      case 0x93: {                                 // STACK_GLOBAL
        Val name = pop(), module = pop();
        Val v = make(Obj::object);
        v->s = module->s + "." + name->s;
        stack.push_back(v);
        break;
      }
      case 'R':                                    // REDUCE: callable(args) -> an object of that callable's kind
      case 0x81: {                                 // NEWOBJ: cls.__new__(cls, *args)
        pop();
        Val callable = pop();
        Val v = make(Obj::object);
        v->s = callable->s;
        stack.push_back(v);
        break;
      }
      case 'b': pop(); break;                      // BUILD: the object keeps its (unread) state
      case 'Q': {                                  // BINPERSID: a tensor storage, not read
        pop();
        Val v = make(Obj::object);
        v->s = "persistent storage";
        stack.push_back(v);
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        throw std::runtime_error(path + ": pickle opcode " + hex + " at byte " + std::to_string(at - 1) +
                                 " is not one a torch.save state uses");
      }
    }
  }
}

}  // namespace

nlohmann::json read_torch_state(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  const std::string z((std::istreambuf_iterator<char>(in)), {});
  return to_json(unpickle(pickle_entry(z, path), path));
}

// ---- SHA-256

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("OpenSSL: cannot start a SHA-256 digest");
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::update(const std::string& data) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data.data(), data.size());
}

void Sha256::update(const void* data, size_t n) { EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n); }

std::string Sha256::hex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest, &n);
  std::string out;
  char two[3];
  for (unsigned int k = 0; k < n; ++k) {
    std::snprintf(two, sizeof two, "%02x", digest[k]);
    out += two;
  }
  return out;
}

}  // namespace olmoref::interop
