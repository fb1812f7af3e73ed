// The chat template interpreter piece by piece: whitespace control, expressions, statements, filters
// and Python formatting (expected texts are what jinja2 3.1 renders, checked with transformers' setup),
// bad templates (a clear error with the line, never a crash or a hang), random bytes as templates,
// finding a model's template, and the `tandem template` command.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>

#include "chat/chat_template.h"
#include "test_util.h"

namespace tandem {
namespace {

using nlohmann::ordered_json;

std::string render(const std::string& source, const ordered_json& vars = ordered_json::object(),
                   const chat::RenderOptions& options = {}) {
  return chat::ChatTemplate::parse(source).render(vars, options);
}

// The error a template gives (parse or render); "" when it renders.
std::string error_of(const std::string& source, const ordered_json& vars = ordered_json::object(),
                     const chat::RenderOptions& options = {}) {
  try {
    render(source, vars, options);
  } catch (const chat::ChatTemplateError& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplatePieces, WhitespaceControlAsTransformers) {
  // trim_blocks + lstrip_blocks
  EXPECT_EQ(render("a\n  {% if true %}\n    b\n  {% endif %}\nc\n"), "a\n    b\nc");
  EXPECT_EQ(render("{% for x in [1,2] %}\n  {{ x }}\n{% endfor %}\n"), "  1\n  2\n");
  // `-` strips every whitespace character on its side, newlines included
  EXPECT_EQ(render("a  {%- if true -%}  b  {%- endif -%}  c  {{- 'd' -}}  e"), "abcde");
  EXPECT_EQ(render("{%- for x in [1,2] -%}\n  {{ x }}\n{%- endfor %}\n\n"), "12");
  // `+` keeps the indentation; comments vanish and take trim_blocks' newline with them
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}\n{# comment #}\ny {#- c -#} z"), "  xyz");
  EXPECT_EQ(render("  {# c #}\n  x {% if 1 %}  \n y{% endif %}"), "  x   \n y");
  EXPECT_EQ(render("{% raw %}{{ x }}{% endraw %}"), "{{ x }}");
  EXPECT_EQ(render("x {%- if 1 %}\u00a0y{% endif -%} \u2003z"), "x\u00a0yz");  // `-` strips Unicode spaces too
  EXPECT_EQ(render("a\r\nb{{ 'c' }}\r\n"), "a\nbc");
}

TEST(ChatTemplatePieces, ValuesPrintAsPython) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 1e16 }} {{ 0.0001 }} {{ 0.00001 }} {{ 1/3 }} {{ 10/2 }} {{ 7//2 }} {{ -7//2 }} "
                   "{{ -7 % 3 }} {{ 2**10 }}"),
            "1.0 1e+16 0.0001 1e-05 0.3333333333333333 5.0 3 -4 2 1024");
  EXPECT_EQ(render("{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ ('a',) }} {{ (1, 2) }}"),
            "[1, 'a', None, True, 1.5, {'k': 'v'}] ('a',) (1, 2)");
  EXPECT_EQ(render("{{ ['it\\'s', 'a\"b', 'both\\'\"'] }}"), "[\"it's\", 'a\"b', 'both\\'\"']");
  EXPECT_EQ(render("{{ ['\\x00', '\\u2028', '\\u00a0', '\\x7f', 'é'] }}"), "['\\x00', '\\u2028', '\\xa0', '\\x7f', 'é']");
  EXPECT_EQ(render("{{ x|string }}|{{ x ~ '' }}|{{ x|tojson }}", {{"x", {{"k", {1, nullptr, true}}}}}),
            "{'k': [1, None, True]}|{'k': [1, None, True]}|{\"k\": [1, null, true]}");
}

TEST(ChatTemplatePieces, TojsonIsPythonJsonDumps) {
  ordered_json d = {{"a", {1, 2, {{"b", nullptr}}}}, {"é", true}};
  EXPECT_EQ(render("{{ d|tojson }}", {{"d", d}}), "{\"a\": [1, 2, {\"b\": null}], \"é\": true}");
  EXPECT_EQ(render("{{ d|tojson(indent=2) }}", {{"d", d}}),
            "{\n  \"a\": [\n    1,\n    2,\n    {\n      \"b\": null\n    }\n  ],\n  \"é\": true\n}");
  ordered_json z = {{"z", "ü🚀"}, {"a", 1}};
  EXPECT_EQ(render("{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ d|tojson(ensure_ascii=true) }}",
                   {{"d", z}}),
            "{\"a\": 1, \"z\": \"ü🚀\"} {\"z\":\"ü🚀\",\"a\":1} {\"z\": \"\\u00fc\\ud83d\\ude80\", \"a\": 1}");
  EXPECT_EQ(render("{{ x|tojson }}", {{"x", {1.5, 1e20, 1e-7, 3.0}}}), "[1.5, 1e+20, 1e-07, 3.0]");
}

TEST(ChatTemplatePieces, Expressions) {
  EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ 'héllo'[1:3] }} {{ [1,2,3,4][1:] }} {{ [1,2,3][-1] }} {{ 'abc'[5] }}|"),
            "cba él [2, 3, 4] 3 |");
  EXPECT_EQ(render("{{ x[1:-1] }}{{ x[::2] }}{{ x[-2:] }}{{ x[10:] }}{{ x[::-2] }}", {{"x", {1, 2, 3, 4, 5}}}),
            "[2, 3, 4][1, 3, 5][4, 5][][5, 3, 1]");
  EXPECT_EQ(render("{{ 'a' in 'cat' }}{{ 1 in [1,2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 == 1.0 }}{{ 1 < 2 < 3 }}"
                   "{{ 'a' ~ 1 ~ none }}{{ 1 and 2 }}{{ 0 or 'x' }}{{ not 0 }}",
                   {{"d", {{"k", 1}}}}),
            "TrueTrueTrueTrueTrueTruea1None2xTrue");
  EXPECT_EQ(render("{{ 1 if 0 else 2 if 0 else 3 }}{{ not 1 == 2 }}{{ -2 ** 2 }}{{ 2 * 3 + 1 }}{{ (1 + 2) ~ 3 }}{{ 'a' ~ 2 * 3 }}"),
            "3True4733a6");
  EXPECT_NE(error_of("{{ 1 + 2 ~ 3 }}").find("unsupported operand"), std::string::npos);  // ~ binds tighter than +
  EXPECT_EQ(render("{{ x }}|{{ d.missing }}|{{ d.missing is defined }}|{{ none.x }}|{{ 'a' if false }}|",
                   {{"d", {{"a", 1}}}}),
            "||False|||");
  EXPECT_EQ(render("{{ x is none }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 1 is number }}"
                   "{{ 1 is true }}{{ false is false }}{{ 6 is divisibleby 3 }}",
                   {{"x", nullptr}}),
            "TrueTrueTrueTrueTrueFalseTrueTrue");
}

TEST(ChatTemplatePieces, Statements) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
                   "{{ loop.length }}{{ loop.revindex }};{% endfor %}"),
            "10TrueFalse33;21FalseFalse32;32FalseTrue31;");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}", {{"d", {{"b", 1}, {"a", 2}}}}), "b=1,a=2,");
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ x }}{{ loop.index }} {% endfor %}"), "11 32 53 74 95 ");
  EXPECT_EQ(render("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "0134");
  // a `set` inside a loop stays in its iteration; namespace() carries values out
  EXPECT_EQ(render("{% set x = 1 %}{% for i in range(3) %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"), "1231");
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}"),
            "4");
  EXPECT_EQ(render("{% if x %}{% set y = 1 %}{% endif %}{{ y }}", {{"x", true}}), "1");
  EXPECT_EQ(render("{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]"), "[block 2]");
  EXPECT_EQ(render("{%- macro greet(name, p='Hi') -%}{{ p }} {{ name }}!{%- endmacro -%}{{ greet('Bob') }} {{ greet('Al', p='Yo') }}"),
            "Hi Bob! Yo Al!");
  EXPECT_EQ(render("{% macro m() %}{{ caller() }}!{% endmacro %}{% call m() %}inside{% endcall %}"), "inside!");
  EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% with c = 3 %}{{ c }}{% endwith %}{{ c }}"), "123");
}

// Which names start undefined in a frame follows jinja2's compiler (expected texts from jinja2 3.1.6).
TEST(ChatTemplatePieces, FramesSeeNamesAsJinja2Does) {
  ordered_json vars = {{"y", "why"}, {"x", true}};
  EXPECT_EQ(render("{{ y }}{% set y = 1 %}{{ y }}", vars), "why1");
  EXPECT_EQ(render("{% for i in [1] %}{{ y }}{% endfor %}{% set y = 1 %}{{ y }}", vars), "1");
  EXPECT_EQ(render("{% for i in [1] %}{{ y }}{% endfor %}{% if false %}{% set y = 1 %}{% endif %}", vars), "why");
  EXPECT_EQ(render("{% for i in [1] %}{{ y }}{% set y = 2 %}{{ y }}{% endfor %}{{ y }}", vars), "why2why");
  EXPECT_EQ(render("{% for i in [1] %}{% for j in [1] %}{{ y }}{% endfor %}{% set y = 2 %}{% endfor %}", vars), "");
  EXPECT_EQ(render("{% macro f() %}{{ y }}{% endmacro %}{{ f() }}{% set y = 1 %}{{ f() }}", vars), "1");
  EXPECT_EQ(render("{% for i in [1, 2] %}{{ y }}{% if i == 1 %}{% set y = 3 %}{% endif %}{{ y }};{% endfor %}", vars),
            "why3;whywhy;");
  EXPECT_EQ(render("{% for i in [1] %}{{ y }}{% endfor %}{% if x %}{% set y = 1 %}{% elif x %}{% set y = 3 %}"
                   "{% else %}{% set y = 2 %}{% endif %}",
                   vars),
            "why");
  EXPECT_EQ(render("{% for i in [] %}{% else %}{{ y }}{% set y = 5 %}{{ y }}{% endfor %}{{ y }}", vars), "why5why");
  EXPECT_EQ(render("{% set x %}{{ y }}{% set y = 9 %}{% endset %}{{ x }}{{ y }}", vars), "whywhy");
}

TEST(ChatTemplatePieces, FiltersAndMethods) {
  EXPECT_EQ(render("{{ '  a b  '|trim }}|{{ 'Hello'|upper }}{{ 'Hello'|lower }}|{{ [1,2]|length }}{{ 'héllo'|length }}|"
                   "{{ [3,1,2]|sort }}|{{ ['a','b']|join(', ') }}|{{ none|default('x') }}{{ u|default('y') }}{{ ''|default('z', true) }}"),
            "a b|HELLOhello|25|[1, 2, 3]|a, b|Noneyz");
  ordered_json msgs = {{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}};
  EXPECT_EQ(render("{{ m|selectattr('role', 'equalto', 'user')|list }}|{{ m|rejectattr('role', 'equalto', 'user')|"
                   "map(attribute='content')|list }}|{{ m|map(attribute='role')|join(',') }}",
                   {{"m", msgs}}),
            "[{'role': 'user', 'content': 'a'}]|['b']|user,assistant");
  EXPECT_EQ(render("{{ x.startswith('he') }}{{ x.endswith('lo') }}{{ ' x '.strip() }}{{ 'xxaxx'.lstrip('x') }}"
                   "{{ 'a,b,c'.split(',') }}{{ 'a b  c'.split() }}{{ 'a,b,c'.rsplit(',', 1) }}",
                   {{"x", "hello"}}),
            "TrueTruexaxx['a', 'b', 'c']['a', 'b', 'c']['a,b', 'c']");
  EXPECT_EQ(render("{{ d.get('a') }}{{ d.get('z') }}{{ d.get('z', 5) }}{{ d.keys()|list }}{{ d.items()|list }}",
                   {{"d", {{"a", 1}}}}),
            "1None5['a'][('a', 1)]");
  EXPECT_EQ(render("{{ '{} and {x}'.format('a', x=1) }}{{ '42'|int + 1 }}{{ 'x'|int }}{{ 2.5|round }}{{ 'a-b'|replace('-', '+') }}"),
            "a and 1430" "2.0a+b");
}

TEST(ChatTemplatePieces, ErrorsAndRaiseException) {
  try {
    render("{{ raise_exception('Only user and assistant roles are supported!') }}");
    FAIL() << "no error";
  } catch (const chat::ChatTemplateError& e) {
    EXPECT_TRUE(e.raised());
    EXPECT_EQ(e.message(), "Only user and assistant roles are supported!");
  }
  EXPECT_NE(error_of("{{ u.x }}").find("'u' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 + 'a' }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(error_of("{{ x|length }}", {{"x", nullptr}}).find("has no len()"), std::string::npos);
  EXPECT_NE(error_of("{{ 3 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(error_of("{{ u|int }}").find("'u' is undefined"), std::string::npos);
  EXPECT_EQ(render("{{ d[1, 2] is defined }}", {{"d", {{"a", 1}}}}), "False");
  EXPECT_NE(error_of("{% set d = {'a': 1} %}{% set d.a = 2 %}").find("non-namespace"), std::string::npos);
}

TEST(ChatTemplatePieces, StrftimeNowUsesTheInjectedClock) {
  chat::RenderOptions options;
  options.now = [] {
    std::tm tm{};
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 11;
    tm.tm_mday = 2;
    tm.tm_hour = 9;
    tm.tm_min = 30;
    return tm;
  };
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y %H:%M') }}", ordered_json::object(), options), "02 Dec 2026 09:30");
}

TEST(ChatTemplateBadInput, SyntaxErrorsNameTheLine) {
  EXPECT_NE(error_of("line1\n{{ a.b( }}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{% for %}").find("line 1"), std::string::npos);
  std::string e = error_of("a\n{% if true %}\nunclosed");
  EXPECT_NE(e.find("'if' block opened at line 2 is never closed"), std::string::npos) << e;
  EXPECT_NE(error_of("{% endif %}").find("unexpected 'endif'"), std::string::npos);
  EXPECT_NE(error_of("{% for x in y %}{% endif %}{% endfor %}").find("unexpected 'endif' inside the 'for' block"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' }").find("unexpected '}'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abc ").find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{# open").find("unclosed comment"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").find("outside of a for loop"), std::string::npos);
  EXPECT_NE(error_of("{% include 'x' %}").find("unsupported tag 'include'"), std::string::npos);
}

TEST(ChatTemplateBadInput, UnknownFilterFailsUnlessInsideAnIf) {
  EXPECT_NE(error_of("\n{{ 'a' | nosuch }}").find("line 2: no filter named 'nosuch'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 is nosuch }}").find("no test named 'nosuch'"), std::string::npos);
  // jinja2 defers a missing filter inside an `if` to when it runs (DeepSeek-V4's from_json relies on it)
  EXPECT_EQ(render("{% if false %}{{ 'a' | nosuch }}{% endif %}ok"), "ok");
  EXPECT_NE(error_of("{% if true %}{{ 'a' | nosuch }}{% endif %}").find("no filter named 'nosuch'"), std::string::npos);
}

TEST(ChatTemplateBadInput, HostileTemplatesEndInAnErrorNotAHang) {
  chat::RenderOptions small;
  small.max_steps = 100000;
  small.max_output = 1 << 20;
  EXPECT_NE(error_of("{% for i in range(1000000000) %}{% endfor %}", ordered_json::object(), small).find("steps"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     ordered_json::object(), small).find("steps"),
            std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}", ordered_json::object(), small).find("too large"), std::string::npos);
  EXPECT_NE(error_of("{% set s = 'x' * 1000 %}{% for i in range(10000) %}{{ s }}{% endfor %}", ordered_json::object(), small)
                .find("larger than"),
            std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nested more than"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}").find("nested too deeply"),
            std::string::npos);
  // long chains are built by loops, not recursion: their height is bounded too (evaluating recurses)
  std::string plus = "{{ 1", attrs = "{{ x", filters = "{{ x";
  for (int i = 0; i < 100000; ++i) {
    plus += "+1";
    attrs += ".a";
    filters += "|string";
  }
  EXPECT_NE(error_of(plus + " }}").find("expression nested too deeply"), std::string::npos);
  EXPECT_NE(error_of(attrs + " }}").find("expression nested too deeply"), std::string::npos);
  EXPECT_NE(error_of(filters + " }}").find("expression nested too deeply"), std::string::npos);
  std::string tall = "f(n - 1)";
  for (int i = 0; i < 250; ++i) tall += "|string";
  EXPECT_NE(error_of("{% macro f(n) %}{% if n > 0 %}{{ " + tall + " }}{% endif %}{% endmacro %}{{ f(31) }}")
                .find("evaluation nested more than"),
            std::string::npos);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nested too deeply"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  // namespaces are the only mutable values: no cycles, no unbounded nesting through them
  EXPECT_NE(error_of("{% set ns = namespace(x=1) %}{% set ns.x = [ns] %}{{ ns }}").find("cannot hold itself"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(x=[]) %}{% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}")
                .find("levels deep"),
            std::string::npos);
  ordered_json deep = ordered_json::array();
  for (int i = 0; i < 2000; ++i) deep = ordered_json::array({deep});
  EXPECT_NE(error_of("{{ x }}", {{"x", deep}}).find("levels deep"), std::string::npos);
}

// Random bytes, and real templates with random bytes changed, are either rendered or refused with a
// ChatTemplateError; nothing else escapes (a crash or another exception fails the test).
TEST(ChatTemplateBadInput, RandomTemplatesNeverCrash) {
  std::mt19937 rng(1234);
  std::string base = test::read_file(TANDEM_SOURCE_DIR "/tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja");
  ASSERT_FALSE(base.empty()) << "missing fixture file: tests/fixtures/chat_templates/Qwen-Qwen3-0.6B.jinja";
  const std::string alphabet = "{}%#-+()[]'\"|.,:=~*/ \n\tabcdefghijklmnopqrstuvwxyz0123456789_";
  ordered_json vars = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"tools", nullptr}, {"add_generation_prompt", true}};
  chat::RenderOptions options;
  options.max_steps = 200000;
  options.max_output = 1 << 20;
  int rendered = 0, refused = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string src;
    if (i % 3 == 0) {
      size_t n = rng() % 64;
      for (size_t k = 0; k < n; ++k) src.push_back(static_cast<char>(rng() % 256));
    } else if (i % 3 == 1) {
      size_t n = rng() % 80;
      for (size_t k = 0; k < n; ++k) src.push_back(alphabet[rng() % alphabet.size()]);
    } else {
      src = base;
      for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) src[rng() % src.size()] = alphabet[rng() % alphabet.size()];
    }
    try {
      render(src, vars, options);
      ++rendered;
    } catch (const chat::ChatTemplateError&) {
      ++refused;
    }
  }
  EXPECT_EQ(rendered + refused, 3000);
  EXPECT_GT(rendered, 0);
  EXPECT_GT(refused, 0);
}

TEST(ChatTemplateModel, FindsTheTemplateAsTransformers) {
  test::TempDir dir;
  EXPECT_THROW(chat::load_model_chat_template(dir.path), InputError);
  test::write_file(dir.file("tokenizer_config.json"),
                   R"({"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>", "chat_template": "{{ bos_token }}x"})");
  auto m = chat::load_model_chat_template(dir.path);
  EXPECT_EQ(m.source, "{{ bos_token }}x");
  EXPECT_EQ(m.bos_token, "<s>");
  EXPECT_EQ(m.eos_token, "</s>");
  test::write_file(dir.file("tokenizer_config.json"),
                   R"({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]})");
  EXPECT_EQ(chat::load_model_chat_template(dir.path).source, "D");
  test::write_file(dir.file("tokenizer_config.json"), R"({"chat_template": [{"name": "tool_use", "template": "T"}]})");
  try {
    chat::load_model_chat_template(dir.path);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no template named \"default\" (it has: tool_use)"), std::string::npos) << e.what();
  }
  test::write_file(dir.file("chat_template.jinja"), "J");
  EXPECT_EQ(chat::load_model_chat_template(dir.path).source, "J");
}

TEST(ChatTemplateCli, RendersAPrompt) {
  test::TempDir dir;
  test::write_file(dir.file("tokenizer_config.json"),
                   R"({"bos_token": "<s>", "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ flavor }}{{ tools|length }}"})");
  test::write_file(dir.file("messages.json"), R"([{"role": "user", "content": "Grüße"}])");
  test::write_file(dir.file("tools.json"), R"([{"type": "function"}])");
  auto r = test::run_tandem({"template", "--model", dir.path, "--messages", dir.file("messages.json"),
                             "--add-generation-prompt", "--tools", dir.file("tools.json"), "--var", "flavor=\"x\""});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[user]Grüße[assistant]x1");
  // --template overrides the model's and keeps its tokens
  test::write_file(dir.file("t.jinja"), "{{ bos_token }}!{{ messages|length }}");
  r = test::run_tandem({"template", "--model", dir.path, "--template", dir.file("t.jinja"), "--messages", dir.file("messages.json")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>!1");
  // bad input: exit code 2 and the template's message
  test::write_file(dir.file("bad.jinja"), "ok\n{% if %}");
  r = test::run_tandem({"template", "--template", dir.file("bad.jinja"), "--messages", dir.file("messages.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("bad.jinja, line 2"), std::string::npos) << r.err;
  test::write_file(dir.file("raise.jinja"), "{{ raise_exception('roles must alternate') }}");
  r = test::run_tandem({"template", "--template", dir.file("raise.jinja"), "--messages", dir.file("messages.json")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("roles must alternate"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tandem
