package sampler

// Vocabulary layout. Token ids are laid out in fixed ranges so that every id
// can be turned back into its text without a table for the large ranges:
//
//	0                                   EOS (renders as "")
//	[1, 1+NumWords)                     " word": a common English word with a
//	                                    leading space (GPT's "Ġword" convention)
//	[1+NumWords, GenerativeVocabSize)   generative punctuation: . , ! ? ; : "\n"
//	[GenerativeVocabSize, +NumWords)    "word": the same words without a space
//	next 5 ids                          other punctuation: ' " ( ) -
//	next 256 ids                        single bytes 0x00..0xff
//	remaining ids up to VocabSize       ASCII pieces of 2, 3 or 4 bytes (every
//	                                    byte < 0x80), numbered as base-128
//	                                    integers within each length
//
// The Generator only ever samples ids below GenerativeVocabSize, so generated
// text is a space-separated sequence of words and punctuation. The tokenizer
// uses the whole range.
const (
	// EOS is the end-of-sequence token id. Its text is empty.
	EOS uint32 = 0

	// NumWords is the number of words in the embedded word list.
	NumWords = len(wordList)

	firstSpacedWord uint32 = 1
	firstGenPunct          = firstSpacedWord + uint32(NumWords)

	// GenerativeVocabSize is the number of ids the Generator samples from:
	// EOS, every space-prefixed word and the generative punctuation. It is a
	// prime (tested), which the per-step rank permutation relies on.
	GenerativeVocabSize = firstGenPunct + uint32(len(genPunct))

	firstBareWord   = GenerativeVocabSize
	firstOtherPunct = firstBareWord + uint32(NumWords)
	firstByte       = firstOtherPunct + uint32(len(otherPunct))
	firstPiece      = firstByte + 256

	pieces2 = 128 * 128
	pieces3 = 128 * 128 * 128
	pieces4 = 128 * 128 * 128 * 128

	// VocabSize is one more than the largest token id Tokenize can produce;
	// every id it returns is < VocabSize. Most of the range is the implicit
	// table of 2–4-byte ASCII pieces, so VocabSize is large (about 2.7e8) even
	// though only a few thousand ids have names.
	VocabSize = firstPiece + pieces2 + pieces3 + pieces4
)

// genPunct lists the punctuation tokens the Generator may emit, in id order.
var genPunct = [...]string{".", ",", "!", "?", ";", ":", "\n"}

// otherPunct lists punctuation tokens that Tokenize recognises but the
// Generator never emits, in id order.
var otherPunct = [...]string{"'", "\"", "(", ")", "-"}

// wordList is the fixed word vocabulary: common English words, lower case,
// letters only, no duplicates (all tested). Changing it changes every token
// id and every generated text, so treat it as frozen.
var wordList = [...]string{
	"the", "of", "and", "to", "a", "in", "is", "it", "you", "that", "he", "was", "for", "on",
	"are", "with", "as", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had",
	"by", "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all",
	"there", "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do",
	"their", "time", "if", "will", "way", "about", "many", "then", "them", "write", "would",
	"like", "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look",
	"more", "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people",
	"my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side",
	"been", "now", "find", "any", "new", "work", "part", "take", "get", "place", "made",
	"live", "where", "after", "back", "little", "only", "round", "man", "year", "came", "show",
	"every", "good", "me", "give", "our", "under", "name", "very", "through", "just", "form",
	"sentence", "great", "think", "say", "help", "low", "line", "differ", "turn", "cause",
	"much", "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does",
	"set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
	"read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big",
	"high", "such", "follow", "act", "why", "ask", "men", "change", "went", "light", "kind",
	"off", "need", "house", "picture", "try", "us", "again", "animal", "point", "mother",
	"world", "near", "build", "self", "earth", "father", "head", "stand", "own", "page",
	"should", "country", "found", "answer", "school", "grow", "study", "still", "learn",
	"plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye", "never",
	"last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might",
	"story", "saw", "far", "sea", "draw", "left", "late", "run", "while", "press", "close",
	"night", "real", "life", "few", "north", "open", "seem", "together", "next", "white",
	"children", "begin", "got", "walk", "example", "ease", "paper", "group", "always", "music",
	"those", "both", "mark", "often", "letter", "until", "mile", "river", "car", "feet",
	"care", "second", "book", "carry", "took", "science", "eat", "room", "friend", "began",
	"idea", "fish", "mountain", "stop", "once", "base", "hear", "horse", "cut", "sure",
	"watch", "color", "face", "wood", "main", "enough", "plain", "girl", "usual", "young",
	"ready", "above", "ever", "red", "list", "though", "feel", "talk", "bird", "soon", "body",
	"dog", "family", "direct", "pose", "leave", "song", "measure", "door", "product", "black",
	"short", "class", "wind", "question", "happen", "complete", "ship", "area", "half", "rock",
	"order", "fire", "south", "problem", "piece", "told", "knew", "pass", "since", "top",
	"whole", "king", "space", "heard", "best", "hour", "better", "true", "during", "hundred",
	"five", "remember", "step", "early", "hold", "west", "ground", "interest", "reach", "fast",
	"verb", "sing", "listen", "six", "table", "travel", "less", "morning", "ten", "simple",
	"several", "vowel", "toward", "war", "lay", "against", "pattern", "slow", "center", "love",
	"person", "money", "serve", "appear", "road", "map", "rain", "rule", "govern", "pull",
	"cold", "notice", "voice", "unit", "power", "town", "fine", "certain", "fly", "fall",
	"lead", "cry", "dark", "machine", "note", "wait", "plan", "figure", "star", "box", "noun",
	"field", "rest", "correct", "able", "pound", "done", "beauty", "drive", "stood", "contain",
	"front", "teach", "week", "final", "gave", "green", "quick", "develop", "ocean", "warm",
	"free", "minute", "strong", "special", "mind", "behind", "clear", "tail", "produce",
	"fact", "street", "inch", "multiply", "nothing", "course", "stay", "wheel", "full",
	"force", "blue", "object", "decide", "surface", "deep", "moon", "island", "foot", "system",
	"busy", "test", "record", "boat", "common", "gold", "possible", "plane", "instead", "dry",
	"wonder", "laugh", "thousand", "ago", "ran", "check", "game", "shape", "hot", "miss",
	"brought", "heat", "snow", "tire", "bring", "yes", "distant", "fill", "east", "paint",
	"language", "among",
}
